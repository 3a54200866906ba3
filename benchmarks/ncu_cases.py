"""One kernel case per call, for Nsight Compute (``benchmarks/device_ncu.sh``): the inputs are built, the public op
runs ``--warm`` times (compile + clocks), then once more -- the launch ncu profiles (``--launch-skip`` = number of
matching launches before it). Cases (H200 bench shapes, smaller s_q where the shape only repeats work):

* ``prefill8k`` / ``prefill64k``: ``flash_mla_sparse_fwd``, s_q 1024, h_q 128, d_qk 576, topk 2048, s_kv 8K / 64K;
* ``sparse_v32`` / ``sparse_v41``: the dispatched sparse decode kernel (``kernel_case`` of mla_sparse_decode.py:
  b 128, s_q 1, h_q 128, topk 2048, s_k 8192 per request) through its launcher -- the 2-CTA cluster kernel (WS3)
  since session 17; ``sparse_v32_ws`` / ``sparse_v41_ws2`` etc. name a launcher (``ws``, ``ws2``, ``ws3``) instead;
* ``dense_decode``: ``flash_mla_with_kvcache`` b 128, s_q 1, h_q 128, s_k 8192 (fixed lengths);
* ``gemm``: ``fp8_gemm_nt`` M 4096, N 7168, K 16384 (1D2D scales, bf16 out).

Usage: ``PYTHONPATH=src python benchmarks/ncu_cases.py CASE [--warm 3]``; prints the kernel name regex to profile.
"""
from __future__ import annotations

import argparse
import os
import sys

import torch

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.join(HERE, "..", "tests"))


def build(case: str):
    import deepkernels as dk
    if case.startswith("prefill"):
        s_kv = 8192 if case == "prefill8k" else 65536
        s_q, topk, h_q = 1024, 2048, 128
        q = (torch.randn(s_q, h_q, 576, device="cuda") / 10).bfloat16()
        kv = (torch.randn(s_kv, 1, 576, device="cuda") / 10).bfloat16()
        ind = torch.rand(s_q, s_kv, device="cuda").argsort(dim=-1)[:, :topk].to(torch.int32).view(s_q, 1, topk)
        return lambda: dk.flash_mla_sparse_fwd(q, kv, ind, 576 ** -0.5)
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
    fn = build(args.case)
    for _ in range(args.warm + 1):
        fn()
    torch.cuda.synchronize()
    print("ok", args.case)
    return 0


if __name__ == "__main__":
    sys.exit(main())
