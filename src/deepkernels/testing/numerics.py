"""Comparison metrics of the upstream test harnesses, so deepkernels' pass/fail thresholds mean the same thing.

- DeepGEMM ``deep_gemm/testing/numeric.py``: :func:`calc_diff`, :func:`count_bytes` (docs/spec/gemm.md §3.1).
- FlashMLA ``tests/kernelkit`` (``compare.py``): :func:`get_cos_diff`, :func:`check_is_allclose`,
  :func:`check_is_bitwise_equal` (docs/spec/mla.md §5.2).
"""
from __future__ import annotations

from typing import List

import torch

__all__ = ["calc_diff", "get_cos_diff", "cos_diff", "check_is_allclose", "check_is_bitwise_equal",
           "assert_bitwise_equal", "count_bytes"]


def _check_pair(name: str, ans: torch.Tensor, ref: torch.Tensor, same_dtype: bool = True) -> None:
    for arg, t in (("ans", ans), ("ref", ref)):
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"{name}: {arg} must be a torch.Tensor, got {type(t).__name__}")
    if ans.shape != ref.shape:
        raise ValueError(f"{name}: shape mismatch: ans {list(ans.shape)} vs ref {list(ref.shape)}")
    if same_dtype and ans.dtype != ref.dtype:
        raise TypeError(f"{name}: dtype mismatch: ans {ans.dtype} vs ref {ref.dtype} (shape {list(ans.shape)})")


def calc_diff(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """DeepGEMM's ``calc_diff``: ``1 - 2*sum(x*y) / sum(x^2 + y^2)`` in float64 (0 = identical, scale-invariant).

    Args:
        x, y: tensors of the same shape, any dtypes (both cast to float64).
    Returns:
        0-d float64 tensor on the inputs' device (no host sync; compare it with a float or call ``float()``).
        Two all-zero inputs give 0 (upstream would give NaN from 0/0; docs/spec/gemm.md §3.1 defines 0).
    Thresholds upstream: FP8 GEMM 1e-3, BF16 1e-5, MQA logits 1e-3 / 5e-6 / 3e-5, HC pre-norm 1e-8.
    Raises:
        ValueError if the shapes differ; TypeError for non-tensors.
    """
    _check_pair("calc_diff", x, y, same_dtype=False)
    x, y = x.double(), y.double()
    den = (x * x + y * y).sum()
    sim = 2 * (x * y).sum() / torch.where(den == 0, torch.ones_like(den), den)
    return torch.where(den == 0, torch.zeros_like(den), 1 - sim)


def get_cos_diff(ans: torch.Tensor, ref: torch.Tensor, dtype: torch.dtype = torch.float64) -> float:
    """FlashMLA's cosine diff: ``1 - 2*sum(ans*ref) / (sum(ans^2) + sum(ref^2))`` computed in ``dtype``.

    Returns 0.0 when ``sum(ref^2) < 1e-12`` (an all-zero reference). Returns a Python float (host sync).
    Raises ValueError if the shapes differ.
    """
    _check_pair("get_cos_diff", ans, ref, same_dtype=False)
    ans, ref = ans.to(dtype), ref.to(dtype)
    ref_sq = (ref * ref).sum().item()
    if ref_sq < 1e-12:
        return 0.0
    den = ref_sq + (ans * ans).sum().item()
    return 1.0 - 2.0 * (ans * ref).sum().item() / den


#: Alias of :func:`get_cos_diff` ("cos-diff" in the FlashMLA tests).
cos_diff = get_cos_diff


def _pos(shape, flat: int) -> List[int]:
    out = []
    for size in reversed(shape):
        out.append(flat % size)
        flat //= size
    return out[::-1]


def check_is_allclose(name: str, ans: torch.Tensor, ref: torch.Tensor, abs_tol: float = 1e-5, rel_tol: float = 1e-2,
                      cos_diff_tol: float = 1e-7, quiet: bool = False,
                      dtype_for_cos_diff_calc: torch.dtype = torch.float64) -> bool:
    """FlashMLA's ``kernelkit.check_is_allclose``: anomaly positions, per-element tolerance, then cosine diff.

    Steps (docs/spec/mla.md §5.2): both cast to FP32; the positions of ``+inf``, ``-inf`` and NaN must match exactly,
    and matched (and unmatched) anomalies are zeroed; an element passes if ``|a-r| < abs_tol`` or
    ``|a-r| / (|r| + 1e-6) < rel_tol``; finally ``|get_cos_diff(a, r)| <= cos_diff_tol``.

    Upstream thresholds (out abs/rel/cos, lse abs/rel): dense decode 8e-4 / 2.01/128 / 5e-6, 1e-6 / 8.01/65536;
    sparse decode 1e-3 / 2.01/128 / 5e-6, 1e-6 / 8.01/65536; sparse prefill 8e-4 / 3.01/128 / 7e-6,
    1e-6 / 2.01/65536 (max_logits 1e-6 / 2.01/65536).

    Args:
        name: label used in the printed report.
        ans, ref: same shape and dtype.
        quiet: do not print the mismatch report.
    Returns:
        True when all three checks pass (host sync).
    Raises:
        ValueError for different shapes, TypeError for different dtypes (upstream asserts).
    """
    _check_pair(f"check_is_allclose({name!r})", ans, ref)
    ans = ans.detach().to(torch.float32).clone()
    ref = ref.detach().to(torch.float32).clone()

    def report(msg: str) -> None:
        if not quiet:
            print(msg)

    anomalies_ok = True
    for label, a_mask, r_mask in (
            ("inf", ans == float("inf"), ref == float("inf")),
            ("-inf", ans == float("-inf"), ref == float("-inf")),
            ("nan", torch.isnan(ans), torch.isnan(ref))):
        ans[a_mask] = 0.0
        ref[r_mask] = 0.0
        if not torch.equal(a_mask, r_mask):
            report(f"`{name}` Anomaly number `{label}` mismatch: {int(a_mask.sum())} in ans but "
                   f"{int(r_mask.sum())} in ref")
            anomalies_ok = False

    cdiff = get_cos_diff(ans, ref, dtype_for_cos_diff_calc)
    abs_err = (ans - ref).abs()
    rel_err = abs_err / (ref.abs() + 1e-6)
    pass_mask = (abs_err < abs_tol) | (rel_err < rel_tol)
    if not anomalies_ok:
        return False
    if not bool(pass_mask.all()):
        failing_abs = abs_err.masked_fill(rel_err < rel_tol, 0)
        failing_rel = rel_err.masked_fill(abs_err < abs_tol, 0)
        ia, ir = int(torch.argmax(failing_abs)), int(torch.argmax(failing_rel))
        flat_a, flat_r = ans.reshape(-1), ref.reshape(-1)
        report(f"`{name}` mismatch")
        report(f"max abs err: {float(failing_abs.max())}: pos {_pos(ans.shape, ia)}, "
               f"{float(flat_a[ia])} vs {float(flat_r[ia])}")
        report(f"max rel err: {float(failing_rel.max())}: pos {_pos(ans.shape, ir)}, "
               f"{float(flat_a[ir])} vs {float(flat_r[ir])}")
        n_pass = int(pass_mask.sum())
        report(f"{n_pass} out of {pass_mask.numel()} passed ({100.0 * n_pass / pass_mask.numel():.2f}%)")
        report(f"Cosine diff: {cdiff} (threshold: {cos_diff_tol})")
        return False
    if abs(cdiff) > cos_diff_tol:
        report(f"`{name}` mismatch: Cosine diff too large: {cdiff} vs {cos_diff_tol})")
        return False
    return True


def check_is_bitwise_equal(name: str, ans: torch.Tensor, ref: torch.Tensor, quiet: bool = False) -> bool:
    """FlashMLA's ``check_is_bitwise_equal``: same shape and dtype and identical bytes (NaN payloads included).

    Raises ValueError/TypeError on shape/dtype mismatch; returns a bool (host sync).
    """
    _check_pair(f"check_is_bitwise_equal({name!r})", ans, ref)
    a, r = _as_bytes(ans), _as_bytes(ref)
    ok = torch.equal(a, r)
    if not ok and not quiet:
        print(f"`{name}` mismatch: not bitwise equal. Mismatch count: {int((ans != ref).sum())} "
              f"out of {ans.numel()}")
    return ok


def _as_bytes(t: torch.Tensor) -> torch.Tensor:
    t = t.detach().contiguous()
    if t.dtype == torch.bool:
        return t.view(torch.uint8)
    return t.reshape(-1).view(torch.uint8) if t.dim() else t.reshape(1).view(torch.uint8)


def assert_bitwise_equal(x: torch.Tensor, y: torch.Tensor, label: str = "") -> None:
    """DeepGEMM's ``assert_bitwise_equal``: raise AssertionError unless shape, dtype and bytes are identical."""
    assert x.shape == y.shape, f"{label}: shape mismatch {list(x.shape)} vs {list(y.shape)}"
    assert x.dtype == y.dtype, f"{label}: dtype mismatch {x.dtype} vs {y.dtype}"
    assert torch.equal(_as_bytes(x), _as_bytes(y)), f"{label}: tensors differ bitwise"


def count_bytes(*tensors) -> int:
    """DeepGEMM's ``count_bytes``: sum of ``numel * element_size`` over tensors, recursing into tuples/lists (so an
    FP8 ``(data, sf)`` pair counts its scale bytes); ``None`` is ignored. Returns bytes (int)."""
    total = 0
    for t in tensors:
        if isinstance(t, (tuple, list)):
            total += count_bytes(*t)
        elif t is not None:
            total += t.numel() * t.element_size()
    return total
