"""One kernel case per call, for Nsight Compute (``benchmarks/device_ncu.sh``): the inputs are built, the public op
runs ``--warm`` times (compile + clocks), then once more -- the launch ncu profiles (``--launch-skip`` = number of
matching launches before it). Cases (H200 bench shapes, smaller s_q where the shape only repeats work):

* ``prefill8k`` / ``prefill64k``: ``flash_mla_sparse_fwd``, s_q 1024, h_q 128, d_qk 576, topk 2048, s_kv 8K / 64K
  (the dispatched kernel: WS2 since session 16); ``prefill8k_ws2`` / ``prefill8k_ws4`` etc. call a launcher directly
  on the same inputs (``ws``, ``ws2``, ``ws3``, ``ws4``: mla/_gluon_sparse_prefill*.py, out-parameter launch);
* ``sparse_v32`` / ``sparse_v41``: the dispatched sparse decode kernel (``kernel_case`` of mla_sparse_decode.py:
  b 128, s_q 1, h_q 128, topk 2048, s_k 8192 per request) through its launcher -- the 2-CTA cluster kernel (WS3)
  since session 17; ``sparse_v32_ws`` / ``sparse_v41_ws2`` etc. name a launcher (``ws``, ``ws2``, ``ws3``) instead;
* ``dense_decode``: ``flash_mla_with_kvcache`` b 128, s_q 1, h_q 128, s_k 8192 (fixed lengths);
* ``gemm``: ``fp8_gemm_nt`` M 4096, N 7168, K 16384 (1D2D scales, bf16 out).

Usage: ``PYTHONPATH=src python benchmarks/ncu_cases.py CASE [--warm 3]``; prints the case and the kernel name regex
to profile (:func:`kernel_regex`, the one device_ncu.sh passes to ncu). Without CUDA: the case name is checked, then
exit 1 with a one-line message (nothing to profile).
"""
from __future__ import annotations

import argparse
import os
import sys

import torch

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.join(HERE, "..", "tests"))


PREFILL_SKV = {"prefill8k": 8192, "prefill64k": 65536}
PREFILL_LAUNCHERS = ("ws", "ws2", "ws3", "ws4")     # suffix -> mla/_gluon_sparse_prefill*.py launcher
DECODE_LAUNCHERS = ("ws", "ws2", "ws3")            # suffix -> mla/_gluon_sparse_decode_*.py launcher


def check_case(case: str) -> None:
    """SystemExit with the known names unless ``case`` is one (needs no GPU)."""
    parts = case.split("_")
    if parts[0] in PREFILL_SKV:
        ok = len(parts) == 1 or (len(parts) == 2 and parts[1] in PREFILL_LAUNCHERS)
    elif parts[0] == "sparse":
        ok = len(parts) == 2 or (len(parts) == 3 and parts[2] in DECODE_LAUNCHERS)
    else:
        ok = case in ("dense_decode", "gemm")
    if not ok:
        raise SystemExit(f"unknown case {case!r}: prefill8k / prefill64k [_{'|_'.join(PREFILL_LAUNCHERS)}], "
                         f"sparse_<fmt> [_{'|_'.join(DECODE_LAUNCHERS)}], dense_decode, gemm")


def kernel_regex(case: str) -> str:
    """The ncu ``--kernel-name`` of the case (the Gluon kernels' Python names; device_ncu.sh's mapping)."""
    parts = case.split("_")
    if parts[0] in PREFILL_SKV:
        # prefill8k: whichever kernel the public op dispatches; _wsN: _sparse_prefill_gluon_<wsN>_kernel exactly
        return f"regex:sparse_prefill_gluon_{parts[1]}_kernel" if len(parts) == 2 else "regex:sparse_prefill_gluon"
    if parts[0] == "sparse":
        return "regex:sparse_decode_gluon"
    return {"dense_decode": "regex:mla_decode_gluon", "gemm": "regex:fp8_gluon"}[case]


def build(case: str):
    import deepkernels as dk
    if case.startswith("prefill"):
        parts = case.split("_")
        s_kv = PREFILL_SKV[parts[0]]
        s_q, topk, h_q = 1024, 2048, 128
        q = (torch.randn(s_q, h_q, 576, device="cuda") / 10).bfloat16()
        kv = (torch.randn(s_kv, 1, 576, device="cuda") / 10).bfloat16()
        ind = torch.rand(s_q, s_kv, device="cuda").argsort(dim=-1)[:, :topk].to(torch.int32).view(s_q, 1, topk)
        if len(parts) == 1:
            return lambda: dk.flash_mla_sparse_fwd(q, kv, ind, 576 ** -0.5)
        from deepkernels.mla import (_gluon_sparse_prefill as P, _gluon_sparse_prefill_ws2 as P2,
                                     _gluon_sparse_prefill_ws3 as P3, _gluon_sparse_prefill_ws4 as P4)
        named = {"ws": lambda *a: P.launch_sparse_prefill_gluon(*a, variant="ws"),
                 "ws2": P2.launch_sparse_prefill_gluon_ws2, "ws3": P3.launch_sparse_prefill_gluon_ws3,
                 "ws4": P4.launch_sparse_prefill_gluon_ws4}
        launch = named[parts[1]]
        assert P2.supported_ws2(q, kv), "the prefill Gluon kernels need sm90 and these shapes"
        out = torch.empty(s_q, h_q, 512, dtype=torch.bfloat16, device="cuda")
        ml = torch.empty(s_q, h_q, device="cuda")
        lse = torch.empty(s_q, h_q, device="cuda")
        return lambda: launch(out, ml, lse, q, kv, ind, 576 ** -0.5, None, None)
    if case.startswith("sparse_"):
        import mla_sparse_decode as B
        from deepkernels.mla import (_gluon_sparse_decode_ws as W, _gluon_sparse_decode_ws2 as W2,
                                     _gluon_sparse_decode_ws3 as W3)
        parts = case.split("_")
        fmt = parts[1]
        c = B.kernel_case(fmt, 128, 1, 128, 2048, 8192)
        out = torch.empty(128, 1, 128, 512, dtype=torch.bfloat16, device="cuda")
        lse = torch.empty(128, 1, 128, device="cuda")
        named = {"ws": W.launch_sparse_decode_gluon_ws, "ws2": W2.launch_sparse_decode_gluon_ws2,
                 "ws3": W3.launch_sparse_decode_gluon_ws3}
        if len(parts) > 2:
            launch = named[parts[2]]
        elif W3.dispatch_on(fmt) and W3.enough_work(128, 2048, c.parts):
            launch = named["ws3"]
        else:
            launch = named["ws2"] if W2.dispatch_on(fmt) else named["ws"]
        return lambda: launch(out, lse, c.q, c.cache, c.ind, c.sched, c.ns, c.scale, fmt)
    if case == "dense_decode":
        from test_mla_decode_reference import make_case
        q, k, bt, sl = make_case(128, 1, 128, 1, [8192] * 128, device="cuda")
        meta = dk.get_mla_metadata()[0]
        return lambda: dk.flash_mla_with_kvcache(q, k, bt, sl, 512, meta)
    if case == "gemm":
        from deepkernels.quant import per_block_cast_to_fp8, per_token_cast_to_fp8
        m, n, k = 4096, 7168, 16384
        a = per_token_cast_to_fp8(torch.randn(m, k, device="cuda").bfloat16(), use_ue8m0=False)
        b = per_block_cast_to_fp8(torch.randn(n, k, device="cuda").bfloat16(), use_ue8m0=False)
        d = torch.empty(m, n, dtype=torch.bfloat16, device="cuda")
        return lambda: dk.fp8_gemm_nt(a, b, d)
    raise SystemExit(f"unknown case {case!r}")


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("case")
    ap.add_argument("--warm", type=int, default=3)
    args = ap.parse_args()
    check_case(args.case)
    if not torch.cuda.is_available():
        print(f"{args.case}: no CUDA device, nothing to profile (kernel {kernel_regex(args.case)})", file=sys.stderr)
        return 1
    fn = build(args.case)
    for _ in range(args.warm + 1):
        fn()
    torch.cuda.synchronize()
    print("ok", args.case, kernel_regex(args.case))
    return 0


if __name__ == "__main__":
    sys.exit(main())
