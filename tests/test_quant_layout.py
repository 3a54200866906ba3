"""deepkernels.quant.layout: TMA-aligned MN-major SF layouts, packed UE8M0 and the transform decision table."""
import pytest
import torch
from hypothesis import given, settings, strategies as st

import deepkernels as dk
from deepkernels.quant.fp8 import dense

pytestmark = pytest.mark.reference


def test_get_tma_aligned_size():
    assert [dk.get_tma_aligned_size(x, 4) for x in (0, 1, 4, 5, 7, 8)] == [0, 4, 4, 8, 8, 8]
    assert dk.get_tma_aligned_size(7, 1) == 16 and dk.get_tma_aligned_size(3, 2) == 8
    with pytest.raises(ValueError, match="element_size"):
        dk.get_tma_aligned_size(7, 3)


@given(st.integers(0, 70), st.integers(0, 9), st.sampled_from([None, 1, 3]), st.booleans())
@settings(max_examples=20, deadline=None)
def test_mn_major_values_and_upstream_strides(mn, sf_k, groups, transposed):
    shape = (mn, sf_k) if groups is None else (groups, mn, sf_k)
    sf = torch.randn(shape)
    if transposed:  # MN-major but unaligned (compact) input
        sf = sf.transpose(-1, -2).contiguous().transpose(-1, -2)
    out = dk.get_mn_major_tma_aligned_tensor(sf)
    a = dk.get_tma_aligned_size(mn, 4)
    assert torch.equal(out, sf)
    if out is not sf:
        expected = (1, a) if groups is None else (a * sf_k, 1, a)
        assert out.stride() == expected
    # idempotent: the result is already aligned and comes back as the same object
    assert dk.get_mn_major_tma_aligned_tensor(out) is out


def test_mn_major_m7_issue23_and_element_positions():
    sf = torch.arange(7 * 3, dtype=torch.float32).view(7, 3)
    out = dk.get_mn_major_tma_aligned_tensor(sf)
    assert out.shape == (7, 3) and out.stride() == (1, 8)      # B37/#23: logical shape kept, stride padded
    flat = out.as_strided((24,), (1,))
    for m in range(7):
        for k in range(3):
            assert flat[m + k * 8] == sf[m, k]


def test_mn_major_identity_when_aligned_b39():
    storage = torch.randn(4 * 3)
    sf = storage.as_strided((4, 3), (1, 4))            # already MN-major, 16-byte aligned
    assert dk.get_mn_major_tma_aligned_tensor(sf) is sf
    g = torch.randn(2, 3, 8).transpose(1, 2)           # [2, 8, 3] strides (24, 1, 8)
    assert dk.get_mn_major_tma_aligned_tensor(g) is g
    one = sf.unsqueeze(0)                              # batch dim with an arbitrary stride(0)
    assert dk.get_mn_major_tma_aligned_tensor(one) is one
    assert dk.get_mn_major_tma_aligned_tensor(one).data_ptr() == storage.data_ptr()


def test_mn_major_noncontiguous_and_errors():
    sf = torch.randn(9, 10)[:, ::2]
    out = dk.get_mn_major_tma_aligned_tensor(sf)
    assert torch.equal(out, sf) and out.stride() == (1, 12)
    with pytest.raises(TypeError, match="float32"):
        dk.get_mn_major_tma_aligned_tensor(sf.double())
    with pytest.raises(ValueError, match="dims"):
        dk.get_mn_major_tma_aligned_tensor(torch.randn(4))


@given(st.integers(1, 40), st.integers(1, 11), st.sampled_from([None, 2]))
@settings(max_examples=15, deadline=None)
def test_packed_ue8m0_layout(mn, sf_k, groups):
    shape = (mn, sf_k) if groups is None else (groups, mn, sf_k)
    sf = dk.ceil_to_ue8m0(torch.rand(shape) * 100)
    out = dk.get_mn_major_tma_aligned_packed_ue8m0_tensor(sf)
    a, pk = dk.get_tma_aligned_size(mn, 4), -(-sf_k // 4)
    assert out.dtype == torch.int32 and out.shape == shape[:-1] + (pk,)
    assert out.stride() == ((1, a) if groups is None else (pk * a, 1, a))
    by = dense(out).view(torch.uint8).view(*shape[:-1], pk * 4)
    exp = (sf.view(torch.int32) >> 23).to(torch.uint8)
    assert torch.equal(by[..., :sf_k], exp) and (by[..., sf_k:] == 0).all()
    assert torch.equal(dk.unpack_ue8m0_from_int(out)[..., :sf_k], sf)


def test_packed_ue8m0_rejects_non_powers_and_psum_gaps():
    with pytest.raises(ValueError, match="powers of two"):
        dk.get_mn_major_tma_aligned_packed_ue8m0_tensor(torch.full((4, 4), 0.3))
    # psum layout: group 0 rows [0, 5), group 1 rows [128, 130); gap rows hold garbage and are ignored
    sf = torch.full((130, 2), 0.3)
    sf[:5] = 2.0
    sf[128:] = 4.0
    psum = torch.tensor([5, 130], dtype=torch.int32)
    out = dk.get_mn_major_tma_aligned_packed_ue8m0_tensor(sf, psum)
    by = dense(out).view(torch.uint8).view(130, 4)
    assert (by[:5, :2] == 128).all() and (by[5:128] == 0).all() and (by[128:, :2] == 129).all()


def test_transform_decision_table_sm90():
    m, k = 7, 300
    sfa = torch.rand(m, 3)
    out = dk.transform_sf_into_required_layout(sfa, m, k, (1, 128, 128), is_sfa=True)
    assert out.stride() == (1, 8) and torch.equal(out, sfa)
    sfb = torch.rand(2, 3)
    assert dk.transform_sf_into_required_layout(sfb, 200, k, (1, 128, 128), is_sfa=False) is sfb
    sfb_t = torch.rand(3, 2).T
    assert dk.transform_sf_into_required_layout(sfb_t, 200, k, (128, 128), None) is sfb_t
    with pytest.raises(ValueError, match="contiguous"):
        dk.transform_sf_into_required_layout(torch.rand(2, 6)[:, ::2], 200, k, (128, 128))
    with pytest.raises(ValueError, match="shape"):
        dk.transform_sf_into_required_layout(torch.rand(m, 2), m, k, (1, 128, 128), is_sfa=True)
    with pytest.raises(ValueError, match="is_sfa"):
        dk.transform_sf_into_required_layout(sfa, m, k, (1, 128, 128))
    with pytest.raises(ValueError, match="is_sfa"):
        dk.transform_sf_into_required_layout(sfa, m, k, (1, 128), is_sfa=True)
    with pytest.raises(ValueError, match="Unknown SF transformation"):
        dk.transform_sf_into_required_layout(torch.rand(m, 10), m, k, (1, 32))
    g = torch.rand(4, m, 3)
    out = dk.transform_sf_into_required_layout(g, m, k, (1, 128), num_groups=4)
    assert out.stride() == (24, 1, 8)


def test_transform_decision_table_sm100():
    mn, k = 300, 1024
    sfb = dk.ceil_to_ue8m0(torch.rand(3, 8))
    out = dk.transform_sf_into_required_layout(sfb, mn, k, (1, 128, 128), is_sfa=False, arch_major=10)
    assert out.dtype == torch.int32 and out.shape == (mn, 2) and out.stride() == (1, 300)
    rows = dk.unpack_ue8m0_from_int(out)
    assert torch.equal(rows, sfb[torch.arange(mn) // 128])
    again = dk.transform_sf_into_required_layout(out, mn, k, (1, 128), arch_major=10)
    assert again is out
    with pytest.raises(ValueError):
        dk.transform_sf_into_required_layout(sfb, mn, k, (128, 32), disable_ue8m0_cast=True, arch_major=10)
    with pytest.raises(ValueError, match="TMA-aligned"):
        dk.transform_sf_into_required_layout(out.contiguous(), mn, k, (1, 128), arch_major=10)
