"""The row softmax every MLA reference uses, computed max-shifted so it is exact at any finite softmax scale."""
from __future__ import annotations

import torch

__all__ = ["softmax_lse"]


def softmax_lse(s: torch.Tensor):
    """Softmax over the last dim of scores ``s [..., n]`` (masked entries ``-inf``), computed as
    ``p = exp(s - m) / L`` with ``m`` the row max and ``L = sum exp(s - m)``, and ``lse = m + log L`` (natural log).

    Every term is ``<= 1`` and the max term is exactly 1, so the result does not depend on the magnitude of the
    scores (a ``logsumexp`` followed by ``exp(s - lse)`` loses ``log L`` in ``lse`` once ``|m|`` is ~1e6 in fp32 and
    then scales the output by up to ``L``). Returns ``(p, lse, empty)``: ``empty`` marks rows with no finite score
    (``n == 0`` or all masked), whose ``p`` is 0 and ``lse`` ``-inf``; NaN scores propagate."""
    if s.shape[-1] == 0:
        m = torch.full(s.shape[:-1], float("-inf"), dtype=s.dtype, device=s.device)
    else:
        m = s.amax(dim=-1)
    empty = torch.isneginf(m)
    m_safe = torch.where(empty, torch.zeros_like(m), m)
    e = torch.exp(s - m_safe[..., None])
    l = e.sum(dim=-1)
    l_safe = torch.where(empty, torch.ones_like(l), l)
    p = e / l_safe[..., None]
    lse = torch.where(empty, torch.full_like(m, float("-inf")), m_safe + torch.log(l_safe))
    return p, lse, empty
