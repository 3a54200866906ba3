"""WS3 (WS2 split consumer + 2-CTA cluster producer sharing, ``deepkernels.mla._gluon_sparse_decode_ws3``) against
WS and WS2 on the same schedule and inputs: V3.2 and V4.1, (b, s_q, h_q) in (128, 1, 128), (128, 2, 128),
(64, 1, 128), topk 2048, s_k 8192 per request (WS3 needs h_q a multiple of 128).

Per row and kernel: ms (``triton.testing.do_bench``), TFLOPS (FlashMLA counting), per-CTA time per 64-token block;
speedup ws3 vs ws2, max |ws3 - ws2| (expected 0: same tile bytes, same consumer), NaN checks, and the driver's
maximum of co-resident 2-CTA clusters for the compiled kernel (``cuOccupancyMaxActiveClusters``; fewer than the
grid's clusters means a second wave). JSON with ``deepkernels.bench.runner.provenance()``.
Usage (GPU): ``PYTHONPATH=src python benchmarks/sparse_decode_ws3.py OUT.json``
"""
from __future__ import annotations

import json
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))


def _max_clusters(W3) -> int | None:
    try:
        from triton.runtime import driver
        la = next(iter(W3._LAUNCHERS.values()))
        return int(driver.active.utils.cuOccupancyMaxActiveClusters(la.function, la.packed[2], 2))
    except Exception:  # noqa: BLE001
        return None


def main(path: str) -> int:
    import mla_sparse_decode as B
    from deepkernels.mla import _gluon_sparse_decode_ws as W
    from deepkernels.mla import _gluon_sparse_decode_ws2 as W2
    from deepkernels.mla import _gluon_sparse_decode_ws3 as W3
    from deepkernels.bench.runner import provenance
    from triton.testing import do_bench

    topk, s_k = 2048, 8192
    rows = []
    B.warm_clocks()
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    for fmt in ("v32", "v41"):
        for b, s_q, h_q in ((128, 1, 128), (128, 2, 128), (64, 1, 128)):
            c = B.kernel_case(fmt, b, s_q, h_q, topk, s_k)
            d_qk, cache, q, ind, sched, ns, parts = c.d_qk, c.cache, c.q, c.ind, c.sched, c.ns, c.parts
            flop, ctas, blocks = c.flop, c.ctas, c.blocks
            row = dict(fmt=fmt, b=b, s_q=s_q, h_q=h_q, topk=topk, s_k=s_k, parts=parts, ctas=ctas, flop=flop)
            outs = {}
            variants = [("ws", W.launch_sparse_decode_gluon_ws), ("ws2", W2.launch_sparse_decode_gluon_ws2),
                        ("ws3", W3.launch_sparse_decode_gluon_ws3)]
            for name, launch in variants:
                out = torch.empty(b, s_q, h_q, 512, dtype=torch.bfloat16, device="cuda")
                lse = torch.empty(b, s_q, h_q, device="cuda")
                fn = (lambda o=out, l_=lse, f=launch: f(o, l_, q, cache, ind, sched, ns, d_qk ** -0.5, fmt))
                try:
                    out.fill_(float("nan"))
                    lse.fill_(float("nan"))
                    fn()
                    torch.cuda.synchronize()
                    outs[name] = (out, lse)
                    row[name + "_nan"] = bool(torch.isnan(out).any() or torch.isnan(lse).any())
                    ms = do_bench(fn, warmup=5, rep=40)
                    row[name + "_ms"] = ms
                    row[name + "_tflops"] = flop / ms / 1e9
                    row[name + "_us_per_block"] = ms * 1e3 * min(ctas, sms) / blocks
                except Exception as e:  # noqa: BLE001
                    row[name + "_error"] = f"{type(e).__name__}: {str(e)[:300]}"
            row["ws3_max_active_clusters"] = _max_clusters(W3)
            row["grid_clusters"] = ctas // 2
            if "ws2_ms" in row and "ws3_ms" in row:
                row["speedup"] = row["ws2_ms"] / row["ws3_ms"]
            if "ws_ms" in row and "ws3_ms" in row:
                row["speedup_vs_ws"] = row["ws_ms"] / row["ws3_ms"]
            if "ws2" in outs and "ws3" in outs:
                (o1, l1), (o2, l2) = outs["ws2"], outs["ws3"]
                row["max_abs_diff_out"] = float((o2.float() - o1.float()).abs().nan_to_num(float("inf")).max())
                fin = torch.isfinite(l1) & torch.isfinite(l2)
                row["max_abs_diff_lse"] = float((l2[fin] - l1[fin]).abs().max()) if fin.any() else 0.0
                row["lse_inf_pattern_equal"] = bool(torch.equal(torch.isfinite(l1), torch.isfinite(l2)))
                row["bit_identical_to_ws2"] = bool(torch.equal(o1, o2) and torch.equal(l1, l2))
            rows.append(row)
            print("%s h_q=%3d b=%3d s_q=%d  ws %.1f TF  ws2 %.1f TF (%.2f us/blk)  ws3 %.1f TF (%.2f us/blk)  "
                  "ws3/ws2 %.3f  max|diff| %.3g  identical %s  nan ws2 %s ws3 %s  clusters %s/%s%s" % (
                      fmt, h_q, b, s_q, row.get("ws_tflops", float("nan")), row.get("ws2_tflops", float("nan")),
                      row.get("ws2_us_per_block", float("nan")), row.get("ws3_tflops", float("nan")),
                      row.get("ws3_us_per_block", float("nan")), row.get("speedup", float("nan")),
                      row.get("max_abs_diff_out", float("nan")), row.get("bit_identical_to_ws2"),
                      row.get("ws2_nan"), row.get("ws3_nan"), row["ws3_max_active_clusters"], row["grid_clusters"],
                      "".join("  %s: %s" % (k, v) for k, v in row.items() if k.endswith("_error"))), flush=True)
            json.dump(dict(provenance=provenance(), rows=rows), open(path, "w"), indent=1)
            del cache, outs
            torch.cuda.empty_cache()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1] if len(sys.argv) > 1 else os.path.join(os.environ.get("OUT", "."),
                                                                      "sparse_decode_ws3.json")))
