"""Benchmark: dense MLA decode at few query rows per kv head (h_q 16 / 32, the bandwidth regime) — the Triton
kernel the public op uses today vs the Gluon kernel (``mla/_gluon_dense_decode.py``, a padded 64-row tile) with
the schedule the Triton path plans (``parts`` for its config) and with one part per SM (64-row planning).

b = 128, h_kv = 1, varlen N(s_k, s_k/2), s_q 1 and 2 (causal), s_k 4096 ... 32768; FlashMLA counting
(benchmarks/mla_decode.py). Usage: python benchmarks/mla_decode_small_rows.py OUT.json
"""
from __future__ import annotations

import json
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(__file__))
sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "src"))

import mla_decode as B  # noqa: E402  (make_inputs, provenance, FlashMLA counting)
import deepkernels.mla.decode as dec  # noqa: E402
from deepkernels.mla import _gluon_dense_decode as G  # noqa: E402
from deepkernels.mla.metadata import compute_schedule  # noqa: E402


def main(path):
    from triton.testing import do_bench
    prov = B.provenance()
    rows_out = []
    x = torch.randn(4096, 4096, device="cuda", dtype=torch.bfloat16)
    for _ in range(200):                       # clocks up before the first timing
        x @ x
    del x
    for s_q in (1, 2):
        for h_q in (16, 32):
            for s_k in (4096, 8192, 16384, 32768):
                causal = s_q > 1
                q, k, bt, sl = B.make_inputs(128, s_q, h_q, 1, s_k)
                tot = int(sl.sum())
                flop = 2 * s_q * tot * h_q * (B.D_QK + B.D_V)
                byts = (tot * B.D_QK + 128 * s_q * h_q * (B.D_QK + B.D_V)) * 2
                scale = B.D_QK ** -0.5
                rows = s_q * h_q
                cfg = dec._pick_config(rows)
                sched_t, ns_t = compute_schedule(sl, dec._num_sm_parts(q.device, rows, 1, cfg))
                sched_g, ns_g = compute_schedule(sl, dec._num_sm_parts(q.device, 64, 1))
                runs = {
                    "triton": lambda: dec._dense_launch(q, k, bt, sl, sched_t, ns_t, scale, causal, cfg),
                    "gluon_triton_parts": lambda: G.gluon_dense_forward(q, k, bt, sl, sched_t, ns_t, scale, causal),
                    "gluon_1_part_per_sm": lambda: G.gluon_dense_forward(q, k, bt, sl, sched_g, ns_g, scale, causal),
                }
                rec = dict(b=128, s_q=s_q, h_q=h_q, h_kv=1, s_k=s_k, causal=causal, total_tokens=tot, flop=flop,
                           bytes=byts, triton_config=list(cfg), parts_triton=sched_t.shape[0],
                           parts_gluon=sched_g.shape[0])
                o_ref, l_ref = runs["triton"]()
                for name, fn in runs.items():
                    try:
                        o, l = fn()
                        err = float((o.float() - o_ref.float()).abs().max())
                        bad = bool(torch.isnan(o).any() or torch.isnan(l).any()) or not (err <= 4e-3)
                        ms = do_bench(fn, warmup=3, rep=30, return_mode="median")
                        rec[name] = dict(us=ms * 1e3, tflops=flop / ms / 1e9, gbps=byts / ms / 1e6,
                                         max_abs_err_vs_triton=err, wrong=bad)
                    except Exception as e:  # noqa: BLE001
                        rec[name] = dict(failed=f"{type(e).__name__}: {str(e)[:300]}")
                rows_out.append(rec)
                with open(path, "w") as f:
                    json.dump({"provenance": prov, "rows": rows_out}, f, indent=1)
                print(f"s_q={s_q} h_q={h_q:2d} s_k={s_k:5d} " + "  ".join(
                    f"{n} {v['gbps']:6.0f} GB/s{' WRONG' if v['wrong'] else ''}" if "gbps" in v else f"{n} FAILED"
                    for n, v in ((n, rec[n]) for n in runs)), flush=True)
                del q, k, bt, sl
                torch.cuda.empty_cache()


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else "mla_decode_small_rows.json")
