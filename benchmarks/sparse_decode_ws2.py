"""WS2 (dense-decode consumer structure: softmax warpgroup + PV warpgroup + the WS producer,
``deepkernels.mla._gluon_sparse_decode_ws2``) against the WS kernel (``_gluon_sparse_decode_ws``) on the same
schedule and inputs (issue #6): V3.2 and V4.1, (b, s_q, h_q) in (128, 1, 128), (128, 2, 128), (64, 1, 128),
(128, 1, 64), topk 2048, s_k 8192 per request.

Per row: ms (``triton.testing.do_bench``), TFLOPS (FlashMLA counting: 2 h_q b s_q topk (d_qk + 512)), the per-CTA
time per 64-token block (``us_per_block``), ws2 / ws time ratio, max |ws2 - ws| of the outputs (not bit-identical:
the row sums are reduced in another order), NaN checks; also ws2 with ``_profile=1`` (the producer runs only the
ring protocol: the consumers' time alone). JSON with ``deepkernels.bench.runner.provenance()``.
Usage (GPU): ``PYTHONPATH=src python benchmarks/sparse_decode_ws2.py OUT.json``
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
    from deepkernels.mla import _gluon_sparse_decode_ws2 as W2
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
            row = dict(fmt=fmt, b=b, s_q=s_q, h_q=h_q, topk=topk, s_k=s_k, parts=parts, ctas=ctas, flop=flop)
            outs = {}
            variants = [("ws", W.launch_sparse_decode_gluon_ws, {}),
                        ("ws2", W2.launch_sparse_decode_gluon_ws2, {}),
                        ("ws2_consumers", W2.launch_sparse_decode_gluon_ws2, dict(_profile=1))]
            for name, launch, extra in variants:
                out = torch.empty(b, s_q, h_q, 512, dtype=torch.bfloat16, device="cuda")
                lse = torch.empty(b, s_q, h_q, device="cuda")
                fn = (lambda o=out, l_=lse, f=launch, e=extra:
                      f(o, l_, q, cache, ind, sched, ns, d_qk ** -0.5, fmt, **e))
                try:
                    out.fill_(float("nan"))
                    fn()
                    torch.cuda.synchronize()
                    if not extra:
                        outs[name] = (out, lse)
                        row[name + "_nan"] = bool(torch.isnan(out).any() or torch.isnan(lse).any())
                    ms = do_bench(fn, warmup=5, rep=40)
                    row[name + "_ms"] = ms
                    row[name + "_tflops"] = flop / ms / 1e9
                    row[name + "_us_per_block"] = ms * 1e3 * min(ctas, sms) / blocks
                except Exception as e:  # noqa: BLE001
                    row[name + "_error"] = f"{type(e).__name__}: {str(e)[:300]}"
            if "ws_ms" in row and "ws2_ms" in row:
                row["ws2_over_ws_time"] = row["ws2_ms"] / row["ws_ms"]
                row["speedup"] = row["ws_ms"] / row["ws2_ms"]
            if "ws" in outs and "ws2" in outs:
                (o1, l1), (o2, l2) = outs["ws"], outs["ws2"]
                row["max_abs_diff_out"] = float((o2.float() - o1.float()).abs().nan_to_num(float("inf")).max())
                fin = torch.isfinite(l1) & torch.isfinite(l2)
                row["max_abs_diff_lse"] = float((l2[fin] - l1[fin]).abs().max()) if fin.any() else 0.0
                row["lse_inf_pattern_equal"] = bool(torch.equal(torch.isfinite(l1), torch.isfinite(l2)))
            rows.append(row)
            print("%s h_q=%3d b=%3d s_q=%d  ws %.1f TF (%.2f us/blk)  ws2 %.1f TF (%.2f us/blk)  ws2 consumers "
                  "%.2f us/blk  speedup %.3f  max|diff| %.3g  nan ws %s ws2 %s%s" % (
                      fmt, h_q, b, s_q, row.get("ws_tflops", float("nan")), row.get("ws_us_per_block", float("nan")),
                      row.get("ws2_tflops", float("nan")), row.get("ws2_us_per_block", float("nan")),
                      row.get("ws2_consumers_us_per_block", float("nan")), row.get("speedup", float("nan")),
                      row.get("max_abs_diff_out", float("nan")), row.get("ws_nan"), row.get("ws2_nan"),
                      "".join("  %s: %s" % (k, v) for k, v in row.items() if k.endswith("_error"))), flush=True)
            json.dump(dict(provenance=provenance(), rows=rows), open(path, "w"), indent=1)
            del cache, outs
            torch.cuda.empty_cache()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1] if len(sys.argv) > 1 else os.path.join(os.environ.get("OUT", "."),
                                                                      "sparse_decode_ws2.json")))
