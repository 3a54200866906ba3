"""deepkernels.testing.numerics: the upstream comparison metrics."""
import math

import pytest
import torch

from deepkernels.testing import (assert_bitwise_equal, calc_diff, check_is_allclose, check_is_bitwise_equal,
                                 count_bytes, get_cos_diff)

pytestmark = pytest.mark.reference


def test_calc_diff_definition():
    x = torch.randn(50, 30)
    y = x + 0.01 * torch.randn(50, 30)
    xd, yd = x.double(), y.double()
    exp = 1 - 2 * (xd * yd).sum() / (xd * xd + yd * yd).sum()
    got = calc_diff(x.bfloat16(), y)  # mixed dtypes allowed, float64 math
    exp_mixed = 1 - 2 * (x.bfloat16().double() * yd).sum() / (x.bfloat16().double() ** 2 + yd ** 2).sum()
    assert got.dtype == torch.float64 and got.dim() == 0
    assert math.isclose(float(got), float(exp_mixed), rel_tol=1e-12)
    assert math.isclose(float(calc_diff(x, y)), float(exp), rel_tol=1e-12)
    assert float(calc_diff(x, x)) == pytest.approx(0, abs=1e-15)
    assert float(calc_diff(x, 3 * x)) == pytest.approx(1 - 6 / 10)   # scale-sensitive only via the ratio
    assert float(calc_diff(torch.zeros(3), torch.zeros(3))) == 0.0
    assert calc_diff(x, y) < 1e-3
    with pytest.raises(ValueError, match="shape"):
        calc_diff(x, y[:3])


def test_cos_diff():
    a, r = torch.randn(100), torch.randn(100)
    exp = 1 - 2 * float((a.double() * r.double()).sum()) / float((a.double() ** 2).sum() + (r.double() ** 2).sum())
    assert get_cos_diff(a, r) == pytest.approx(exp, rel=1e-12)
    assert get_cos_diff(a, torch.zeros(100)) == 0  # reference all zero


def test_check_is_allclose_basic_and_tolerances():
    r = torch.randn(64, 32)
    assert check_is_allclose("same", r, r.clone())
    a = r.clone()
    a[3, 4] += 1.0
    assert not check_is_allclose("off", a, r, quiet=True)
    # a small absolute error passes through abs_tol; a relative one through rel_tol
    b = r + 5e-6
    assert check_is_allclose("abs", b, r, abs_tol=1e-5, rel_tol=0, cos_diff_tol=1e-6)
    c = r * (1 + 1e-3)
    assert check_is_allclose("rel", c, r, abs_tol=0, rel_tol=2e-3, cos_diff_tol=1e-5)
    # per-element ok but cosine diff too large
    d = r * 1.01
    assert not check_is_allclose("cos", d, r, abs_tol=1, rel_tol=1, cos_diff_tol=1e-7, quiet=True)


def test_check_is_allclose_anomaly_positions(capsys):
    r = torch.tensor([1.0, float("inf"), float("-inf"), float("nan"), 2.0])
    assert check_is_allclose("match", r.clone(), r)
    a = r.clone()
    a[1], a[4] = 0.5, float("inf")          # inf moved: position mismatch
    assert not check_is_allclose("moved", a, r)
    assert "Anomaly number `inf` mismatch" in capsys.readouterr().out
    a = r.clone()
    a[3] = 7.0                              # NaN replaced by a finite value
    assert not check_is_allclose("nan", a, r, quiet=True)
    # lse-like: +inf for empty rows in both
    lse = torch.tensor([[float("inf"), 1.5], [0.25, float("inf")]])
    assert check_is_allclose("lse", lse.clone(), lse, abs_tol=1e-6, rel_tol=8.01 / 65536)


def test_check_is_allclose_type_errors():
    with pytest.raises(TypeError, match="dtype"):
        check_is_allclose("x", torch.zeros(2), torch.zeros(2, dtype=torch.bfloat16))
    with pytest.raises(ValueError, match="shape"):
        check_is_allclose("x", torch.zeros(2), torch.zeros(3))


def test_bitwise_helpers():
    x = torch.tensor([1.0, float("nan"), -0.0])
    assert check_is_bitwise_equal("x", x, x.clone())
    assert not check_is_bitwise_equal("x", x, torch.tensor([1.0, float("nan"), 0.0]), quiet=True)
    assert_bitwise_equal(x, x.clone(), "x")
    with pytest.raises(AssertionError):
        assert_bitwise_equal(x, x.double(), "x")


def test_count_bytes():
    a = torch.empty(10, 20, dtype=torch.float8_e4m3fn)
    sf = torch.empty(10, 1)
    assert count_bytes(a) == 200
    assert count_bytes((a, sf), None, [torch.empty(3, dtype=torch.bfloat16)]) == 200 + 40 + 6
