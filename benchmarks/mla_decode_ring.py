"""Default Gluon dense MLA decode vs its opt-in variant (``deepkernels.mla._gluon_dense_decode``, launcher keywords
``half_tiles`` / ``q_tma``) on the same schedule and inputs.

Shapes: b 128, h_kv 1, h_q 128 and 64, s_q 1 and 2 (causal when 2), varlen s_k 4096 / 8192 / 32768
(``benchmarks/mla_decode.py`` make_inputs: max(N(s_k, s_k/2), s_q), FlashMLA FLOP counting 2 s_q sum(len) h_q
(576 + 512)); schedule = the one the dispatched path plans (``decode._num_sm_parts`` for the rows, 64-row blocks).
Providers: ``default`` (as dispatched), ``ring`` (half_tiles + q_tma: the variant), ``half`` (half tiles only),
``qtma`` (Q by TMA only); each timed with ``triton.testing.do_bench`` (median; the whole forward: allocation,
kernel, combine, as in the existing dense decode benches), the default timed again at the end of each shape (noise).
Per row: TFLOPS, ratio to the default, max |out - default| and |lse - default| (finite lse), NaN checks on
NaN-poisoned outputs. JSON with ``deepkernels.bench.runner.provenance()``.
Usage (GPU): ``PYTHONPATH=src python benchmarks/mla_decode_ring.py OUT.json`` (env SKS, REP_MS, VARIANTS)
"""
from __future__ import annotations

import json
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

PROVIDERS = {"default": (False, False), "ring": (True, True), "half": (True, False), "qtma": (False, True)}


def main(path: str) -> int:
    import mla_decode as B                      # make_inputs, FlashMLA counting
    import deepkernels.mla.decode as dec
    from deepkernels.mla import _gluon_dense_decode as G
    from deepkernels.mla.metadata import compute_schedule
    from deepkernels.bench.runner import provenance
    from triton.testing import do_bench

    rep_ms = int(os.environ.get("REP_MS", "20"))
    sks = [int(x) for x in os.environ.get("SKS", "4096,8192,32768").split(",")]
    names = [n for n in os.environ.get("VARIANTS", "default,ring,half,qtma").split(",") if n in PROVIDERS]
    if "default" not in names:
        names.insert(0, "default")
    prov = provenance()
    prov["gluon_config"] = list(G.GLUON_DEFAULT)
    prov["providers"] = {n: dict(half_tiles=PROVIDERS[n][0], q_tma=PROVIDERS[n][1]) for n in names}
    rows = []
    x = torch.randn(4096, 4096, device="cuda", dtype=torch.bfloat16)
    for _ in range(300):                        # clocks up before the first timing
        x @ x
    del x
    for h_q in (128, 64):
        for s_q in (1, 2):
            for s_k in sks:
                causal = s_q > 1
                q, k, bt, sl = B.make_inputs(128, s_q, h_q, 1, s_k)
                tot = int(sl.sum())
                flop = 2 * s_q * tot * h_q * (B.D_QK + B.D_V)
                scale = B.D_QK ** -0.5
                nrows = s_q * h_q
                sched, ns = compute_schedule(sl, dec._num_sm_parts(q.device, nrows, 1))
                rec = dict(b=128, s_q=s_q, h_q=h_q, h_kv=1, s_k=s_k, causal=causal, total_tokens=tot, flop=flop,
                           parts=int(sched.shape[0]), q_tma_supported=G.q_tma_supported(q, 1))
                outs = {}
                for n in names:
                    ht, qt = PROVIDERS[n]
                    fn = (lambda ht=ht, qt=qt: G.gluon_dense_forward(q, k, bt, sl, sched, ns, scale, causal,
                                                                      half_tiles=ht, q_tma=qt))
                    try:
                        dec._POISON_OUTPUTS = True       # outputs NaN-filled first: every element must be written
                        o, l = fn()
                        torch.cuda.synchronize()
                        dec._POISON_OUTPUTS = False      # (the fills stay out of the timed calls)
                        outs[n] = (o, l)
                        ms = do_bench(fn, warmup=3, rep=rep_ms, return_mode="median")
                        rec[n] = dict(ms=ms, tflops=flop / ms / 1e9,
                                      nan=bool(torch.isnan(o).any() or torch.isnan(l).any()))
                    except Exception as e:  # noqa: BLE001
                        dec._POISON_OUTPUTS = False
                        rec[n] = dict(failed=f"{type(e).__name__}: {str(e)[:300]}")
                if "ms" in rec.get("default", {}):
                    ms2 = do_bench(lambda: G.gluon_dense_forward(q, k, bt, sl, sched, ns, scale, causal),
                                   warmup=3, rep=rep_ms, return_mode="median")
                    rec["default"]["ms_again"] = ms2
                    rec["default"]["tflops_again"] = flop / ms2 / 1e9
                    o_d, l_d = outs["default"]
                    for n in names:
                        if n == "default" or "ms" not in rec[n]:
                            continue
                        o, l = outs[n]
                        rec[n]["ratio_vs_default"] = rec["default"]["ms"] / rec[n]["ms"]
                        rec[n]["max_abs_diff_out"] = float((o.float() - o_d.float()).abs().nan_to_num(
                            float("inf")).max())
                        fin = torch.isfinite(l) & torch.isfinite(l_d)
                        rec[n]["max_abs_diff_lse"] = float((l[fin] - l_d[fin]).abs().max()) if fin.any() else 0.0
                        rec[n]["lse_inf_pattern_equal"] = bool(torch.equal(torch.isinf(l), torch.isinf(l_d)))
                rows.append(rec)
                with open(path, "w") as f:
                    json.dump(dict(provenance=prov, rows=rows), f, indent=1)
                parts = []
                for n in names:
                    v = rec[n]
                    if "ms" not in v:
                        parts.append(f"{n} FAILED {v.get('failed', '')[:80]}")
                        continue
                    s = f"{n} {v['tflops']:6.1f} TF"
                    if n == "default":
                        s += f" (again {v.get('tflops_again', float('nan')):6.1f})"
                    else:
                        s += f" x{v.get('ratio_vs_default', float('nan')):.3f} d{v.get('max_abs_diff_out', -1):.1e}"
                    parts.append(s + (" NaN" if v["nan"] else ""))
                print(f"SUMMARY h_q={h_q:3d} s_q={s_q} s_k={s_k:5d} parts {rec['parts']:3d}  " + "  ".join(parts),
                      flush=True)
                del q, k, bt, sl, outs
                torch.cuda.empty_cache()
    dec._POISON_OUTPUTS = False
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1] if len(sys.argv) > 1 else os.path.join(os.environ.get("OUT", "."),
                                                                      "mla_decode_ring.json")))
