"""Where the warp-specialised sparse decode kernel spends its time (issue #6): the kernel against its two timing
diagnostics on the same schedule and inputs (``launch_sparse_decode_gluon_ws(..., _profile=1/2)``):

* ``consumers`` (PROFILE 1): the producer runs only the ring protocol (no gather, no dequant), the consumers do all
  their per-block work -> the consumers' time alone;
* ``producer`` (PROFILE 2): the consumers release every slot at once (no math) -> the producer's time alone;
* ``ws_asm`` / ``producer_asm``: the same with the producer's inline-PTX dequantisation (``deq_asm=True``);
  ``*_pf``: with the producer's L2 prefetch of block j+2 (``pf_l2=True``); the real kernels (PROFILE 0) are checked
  bit-identical to the default kernel's output.

If the kernel time is close to one of them, that side is the limit; if it is well above both, the hand-off (ring
depth, barriers) is. Reported per row: ms, TFLOPS-equivalent (FlashMLA counting, the kernel's FLOPs over each
variant's time) and the per-CTA time per 64-token block (``us_per_block``: time x CTAs per wave / blocks).
Usage (GPU): ``PYTHONPATH=src python benchmarks/sparse_decode_ws_profile.py OUT.json``
"""
from __future__ import annotations

import json
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))


def main(path: str) -> int:
    import mla_sparse_decode as B
    from deepkernels.mla import _gluon_sparse_decode_ws as W
    from deepkernels.bench.runner import provenance
    from triton.testing import do_bench

    topk, s_k = 2048, 8192
    rows = []
    B.warm_clocks()
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    for fmt in ("v32", "v41"):
        for b, s_q, h_q in ((128, 1, 128), (128, 2, 128), (64, 1, 128), (128, 1, 64)):
            c = B.kernel_case(fmt, b, s_q, h_q, topk, s_k)
            d_qk, cache, q, ind, sched, ns, parts = c.d_qk, c.cache, c.q, c.ind, c.sched, c.ns, c.parts
            flop, ctas, blocks = c.flop, c.ctas, c.blocks
            out = torch.empty(b, s_q, h_q, 512, dtype=torch.bfloat16, device="cuda")
            lse = torch.empty(b, s_q, h_q, device="cuda")
            row = dict(fmt=fmt, b=b, s_q=s_q, h_q=h_q, topk=topk, parts=parts, ctas=ctas, flop=flop)
            # (name, PROFILE, inline-PTX dequant, L2 prefetch of block j+2)
            variants = [("ws", 0, False, False), ("consumers", 1, False, False), ("producer", 2, False, False),
                        ("ws_asm", 0, True, False), ("producer_asm", 2, True, False),
                        ("ws_pf", 0, False, True), ("producer_pf", 2, False, True),
                        ("ws_asm_pf", 0, True, True), ("producer_asm_pf", 2, True, True)]
            ref = None
            for name, prof, asm, pf in variants:
                fn = (lambda p=prof, a=asm, f=pf: W.launch_sparse_decode_gluon_ws(
                    out, lse, q, cache, ind, sched, ns, d_qk ** -0.5, fmt, _profile=p, deq_asm=a, pf_l2=f))
                try:
                    out.fill_(float("nan"))
                    fn()
                    torch.cuda.synchronize()
                    if prof == 0:      # the real kernels: each must equal the default one bit for bit
                        if ref is None:
                            ref = (out.clone(), lse.clone())
                        else:
                            row[name + "_bit_identical"] = bool(
                                torch.equal(out.nan_to_num(7.0), ref[0].nan_to_num(7.0))
                                and torch.equal(lse.nan_to_num(7.0), ref[1].nan_to_num(7.0)))
                    ms = do_bench(fn, warmup=5, rep=40)
                    row[name + "_ms"] = ms
                    row[name + "_tflops_equiv"] = flop / ms / 1e9
                    row[name + "_us_per_block"] = ms * 1e3 * min(ctas, sms) / blocks
                except Exception as e:  # noqa: BLE001
                    row[name + "_error"] = f"{type(e).__name__}: {str(e)[:200]}"
            rows.append(row)
            print("%s h_q=%3d b=%3d s_q=%d  " % (fmt, h_q, b, s_q) + "  ".join(
                "%s %.1f TF (%.2f us/blk)" % (n, row.get(n + "_tflops_equiv", float("nan")),
                                              row.get(n + "_us_per_block", float("nan")))
                for n, *_ in variants) + "  bit-identical asm %s pf %s asm+pf %s" % (
                    row.get("ws_asm_bit_identical"), row.get("ws_pf_bit_identical"),
                    row.get("ws_asm_pf_bit_identical")), flush=True)
            json.dump(dict(provenance=provenance(), rows=rows), open(path, "w"), indent=1)
            del cache
            torch.cuda.empty_cache()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1] if len(sys.argv) > 1 else os.path.join(os.environ.get("OUT", "."),
                                                                      "sparse_decode_ws_profile.json")))
