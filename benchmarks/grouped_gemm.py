"""Grouped GEMM benchmark: deepkernels m-grouped contiguous / masked FP8 GEMMs vs a per-group cuBLAS blockwise loop
(``torch._scaled_mm`` once per group) in the same run, on DeepGEMM's published configs plus a DeepSeek-V3 MoE
layer with a skewed expert load.

Timing: ``triton.testing.do_bench`` (median of CUDA-event timings of the whole call, L2 flushed between calls),
as shared/ANCHORS.md. FLOPs: ``2 * rows * N * K`` over valid rows (contiguous: DeepGEMM's layout has no padding
at these M/group; masked: ``sum(masked_m)``). Bytes (spec/gemm.md §4.1): contiguous ``count_bytes(a, b, d)``;
masked ``count_bytes(a, d) * sum(masked_m) / (G * M_max) + count_bytes(b)``; FP8 scale tensors included. The
DeepGEMM published numbers (H800) are in ``PUBLISHED`` for the ratio; the target is >= 1.0 of them.

    python benchmarks/grouped_gemm.py [--out FILE.json] [--dry-run] [--only contiguous,masked,moe]
    python benchmarks/grouped_gemm.py --summary FILE.json

Gluon variant rows (``GROUPED_BENCH_GLUON=1``, the default; direct launchers, each checked before it is timed):
contiguous s6 / s6_pf / s6_epi, masked s4 / s6 / s4_epi / s6_epi, plus the public ops through the env switches
(``public_gluon``, ``public_gluon_epi``, masked ``public_epi`` = ``DEEPKERNELS_GROUPED_EPI=1``). The ``*_epi``
configs (TMA-store epilogue, not dispatched by default, not yet run on a GPU when added) must also be bit-identical
to their register-epilogue twin's output (``bit_identical``). ``GROUPED_BENCH_EPI_AB=1``: only the register / EPI
pairs (contiguous s6 vs s6_epi, masked s4 vs s4_epi) and the EPI public rows, each pair timed in
``GROUPED_BENCH_ROUNDS`` (default 3) alternating rounds (median; ``us_rounds`` kept), so slow clock drift hits both.
"""
from __future__ import annotations

import argparse
import datetime
import json
import math
import os
import platform
import subprocess
import sys
import time

import torch

CONTIGUOUS = [(4, 8192, 4096, 7168), (4, 8192, 7168, 2048), (8, 4096, 4096, 7168), (8, 4096, 7168, 2048)]
MASKED = [(1, 1024, 4096, 7168), (1, 1024, 7168, 2048), (2, 512, 4096, 7168), (2, 512, 7168, 2048),
          (4, 256, 4096, 7168), (4, 256, 7168, 2048)]
MASKED_M_MAX = 4096  # DeepGEMM's masked test allocates max_m = 4096 rows per group
PUBLISHED = {("contiguous",) + s: t for s, t in zip(CONTIGUOUS, (1346, 1214, 1346, 1214))}
PUBLISHED.update({("masked",) + s: t for s, t in zip(MASKED, (1233, 925, 1040, 916, 932, 815))})
# DeepSeek-V3 MoE layer: 256 experts / EP8 = 32 local experts, 8192 routed rows (tokens x top-8 / EP), Zipf-skewed
MOE = dict(experts=32, rows=8192, shapes=[("up", 4096, 7168), ("down", 7168, 2048)])


def provenance() -> dict:
    import triton
    p = {"torch": torch.__version__, "triton": triton.__version__, "python": platform.python_version(),
         "git_sha": os.environ.get("GIT_SHA") or _run(["git", "rev-parse", "HEAD"]),
         "time_utc": datetime.datetime.now(datetime.timezone.utc).isoformat()}
    if torch.cuda.is_available():
        p.update(gpu=torch.cuda.get_device_name(), cuda=torch.version.cuda,
                 num_sms=torch.cuda.get_device_properties(0).multi_processor_count,
                 driver=_run(["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"]))
    return p


def _run(cmd):
    try:
        return subprocess.run(cmd, capture_output=True, text=True, timeout=20).stdout.strip() or None
    except Exception:
        return None


def bench(fn, dry: bool) -> float:
    """Median µs per call."""
    if dry:
        fn()
        t = time.perf_counter()
        fn()
        return (time.perf_counter() - t) * 1e6
    import triton.testing
    return triton.testing.do_bench(fn, warmup=10, rep=60, return_mode="median") * 1e3


def bench_graph(fn, dry: bool):
    """Median µs per call replayed from a CUDA graph (host launch cost removed), or None."""
    if dry:
        return None
    import triton.testing
    try:
        return triton.testing.do_bench_cudagraph(fn, rep=30, return_mode="median") * 1e3
    except Exception:
        return None


def nbytes(*ts) -> int:
    return sum(t.numel() * t.element_size() for t in ts if t is not None)


def fp8_weights(g, n, k, device):
    from deepkernels.quant import per_block_cast_to_fp8
    data = torch.empty(g, n, k, dtype=torch.float8_e4m3fn, device=device)
    sf = torch.empty(g, -(-n // 128), -(-k // 128), dtype=torch.float32, device=device)
    for i in range(g):
        data[i], sf[i] = per_block_cast_to_fp8(torch.randn(n, k, device=device, dtype=torch.bfloat16))
    return data, sf


def fp8_rows(m, k, device):
    from deepkernels.quant import per_token_cast_to_fp8
    return per_token_cast_to_fp8(torch.randn(m, k, device=device, dtype=torch.bfloat16))


def cublas_loop(a_slices, b, out_slices):
    """Per-group ``torch._scaled_mm`` (1x128 MN-major activation scales x 128x128 weight scales, transposed view).

    Returns a callable, or (None, why) when cuBLAS refuses the layout."""
    data_b, sf_b = b
    args = []
    for g, (a_data, sfa) in enumerate(a_slices):
        if a_data.shape[0] == 0:
            continue
        args.append((g, a_data, sfa.T.contiguous().T, sf_b[g].contiguous().T))

    def fn():
        for g, a_data, sfa, sfb in args:
            out_slices[g].copy_(torch._scaled_mm(a_data, data_b[g].T, scale_a=sfa, scale_b=sfb,
                                                 out_dtype=torch.bfloat16))
    return fn


def _ratio_fields(row, flops, byts, key):
    if row.get("us"):
        row["tflops"] = flops / row["us"] / 1e6
        row["gbps"] = byts / row["us"] / 1e3
    if row.get("cublas_us"):
        row["cublas_tflops"] = flops / row["cublas_us"] / 1e6
        if row.get("us"):
            row["ratio_vs_cublas"] = row["cublas_us"] / row["us"]
    pub = PUBLISHED.get(key)
    if pub:
        row["deepgemm_published_tflops"] = pub
        if row.get("tflops"):
            row["ratio_vs_published"] = row["tflops"] / pub


def _time_pair(row, ours, cublas, d, d_cublas, ref_fn, dry):
    from deepkernels.testing import calc_diff
    try:
        d.fill_(float("nan"))
        ours()
        ref = ref_fn()
        row["diff_vs_dequant"] = float(calc_diff(torch.nan_to_num(d.float(), nan=1e4), ref))
        row["us"] = bench(ours, dry)
        row["graph_us"] = bench_graph(ours, dry)
    except Exception as e:  # keep going: one failure must not stop the other rows
        row["error"] = f"{type(e).__name__}: {str(e)[:300]}"
    if dry:
        row["cublas_note"] = "dry run"
        return
    try:
        cublas()
        row["cublas_diff_vs_dequant"] = float(calc_diff(d_cublas.float(), ref_fn()))
        row["cublas_us"] = bench(cublas, dry)
    except Exception as e:
        row["cublas_note"] = f"refused ({type(e).__name__}: {str(e)[:200]})"


def _dequant_ref(a_slices, b, dev_rows):
    """fp32 product of the dequantized operands, per group, written at dev_rows[g] (row index tensors)."""
    data_b, sf_b = b
    k = data_b.shape[-1]

    def fn():
        outs = []
        for g, (a_data, sfa) in enumerate(a_slices):
            aq = a_data.float() * sfa.repeat_interleave(128, 1)[:, :k]
            bq = data_b[g].float() * sf_b[g].repeat_interleave(128, 0)[:data_b.shape[1]].repeat_interleave(128, 1)[:, :k]
            outs.append(aq @ bq.T)
        return outs
    return fn


def run_contiguous(g, m, n, k, device, dry, label="contiguous", counts=None):
    import deepkernels as dk
    counts = counts or [m] * g
    align = dk.get_mk_alignment_for_contiguous_layout()
    layout, starts = [], []
    for i, c in enumerate(counts):
        starts.append(len(layout))
        layout += [i] * c + [-1] * (-(-c // align) * align - c)
    gl = torch.tensor(layout, dtype=torch.int32, device=device)
    m_sum = gl.numel()
    A = fp8_rows(m_sum, k, device)
    B = fp8_weights(g, n, k, device)
    d = torch.empty(m_sum, n, dtype=torch.bfloat16, device=device)
    d_cublas = torch.zeros_like(d)
    a_slices = [(A[0][s:s + c], A[1][s:s + c]) for s, c in zip(starts, counts)]
    out_slices = [d_cublas[s:s + c] for s, c in zip(starts, counts)]
    valid = sum(counts)
    flops = 2 * valid * n * k
    byts = nbytes(A[0], A[1], B[0], B[1], d)
    row = {"op": "m_grouped_fp8_gemm_nt_contiguous", "kind": label, "g": g, "m_per_group": m, "n": n, "k": k,
           "m_sum": m_sum, "valid_rows": valid, "flops": flops, "bytes": byts}
    deq = _dequant_ref(a_slices, B, None)

    def ref_full():
        full = torch.zeros(m_sum, n, device=device)
        for (s, c), o in zip(zip(starts, counts), deq()):
            full[s:s + c] = o
        return full
    ours = lambda: dk.m_grouped_fp8_gemm_nt_contiguous(A, B, d, gl)  # noqa: E731
    _time_pair(row, ours, cublas_loop(a_slices, B, out_slices), d, d_cublas, ref_full, dry)
    _ratio_fields(row, flops, byts, (label, g, m, n, k))
    if not dry and os.environ.get("GROUPED_BENCH_GLUON", "1") == "1":
        _gluon_contiguous(row, A, B, d, gl, ref_full, flops)
    return row


def _time_variant(r, fn, row, flops, graph=True):
    """Time one checked Gluon variant into ``r``: whole call µs (and CUDA-graph µs), TFLOPS, and its ratios to the
    public op (``vs_public``) and the per-group cuBLAS loop (``vs_cublas``) of the same ``row``."""
    r["us"] = bench(fn, False)
    if graph:
        r["graph_us"] = bench_graph(fn, False)
    _variant_ratios(r, row, flops)


def _variant_ratios(r, row, flops):
    r["tflops"] = flops / r["us"] / 1e6
    if row.get("us"):
        r["vs_public"] = row["us"] / r["us"]
    if row.get("cublas_us"):
        r["vs_cublas"] = row["cublas_us"] / r["us"]


def _epi_ab() -> bool:
    return os.environ.get("GROUPED_BENCH_EPI_AB", "0") == "1"


def _time_checked(out, fns, row, flops):
    """Time the checked variants ``fns`` ({name: fn}, names already in ``out`` without an error): one
    :func:`_time_variant` each; with ``GROUPED_BENCH_EPI_AB=1`` instead ``GROUPED_BENCH_ROUNDS`` rounds in
    alternating order (median whole-call µs, ``us_rounds`` kept), then one CUDA-graph time each."""
    names = [k for k in fns if not out[k].get("error")]
    if not _epi_ab():
        for k in names:
            try:
                _time_variant(out[k], fns[k], row, flops)
            except Exception as e:
                out[k]["error"] = f"{type(e).__name__}: {str(e)[:300]}"
        return
    rounds = int(os.environ.get("GROUPED_BENCH_ROUNDS", "3"))
    for i in range(rounds):
        for k in (names if i % 2 == 0 else names[::-1]):
            try:
                out[k].setdefault("us_rounds", []).append(bench(fns[k], False))
            except Exception as e:
                out[k]["error"] = f"{type(e).__name__}: {str(e)[:300]}"
    for k in names:
        r = out[k]
        if r.get("error") or not r.get("us_rounds"):
            continue
        r["us"] = sorted(r["us_rounds"])[len(r["us_rounds"]) // 2]
        r["graph_us"] = bench_graph(fns[k], False)
        _variant_ratios(r, row, flops)


def _vs_register(out, pairs):
    """``vs_register`` = register-epilogue µs / EPI µs for each timed (register config, EPI config) pair."""
    for reg, epi in pairs:
        a, b = out.get(reg.name(), {}), out.get(epi.name(), {})
        if a.get("us") and b.get("us"):
            b["vs_register"] = a["us"] / b["us"]
            if a.get("graph_us") and b.get("graph_us"):
                b["graph_vs_register"] = a["graph_us"] / b["graph_us"]


def _same_bits(x, y) -> bool:
    """x and y bit-identical, NaN == NaN (the EPI variant vs its register-epilogue twin)."""
    try:
        torch.testing.assert_close(x, y, rtol=0, atol=0, equal_nan=True)
        return True
    except AssertionError:
        return False


def _public_env(env: dict, fn, r, ref_check, row, flops):
    """One public-op variant under the env switches ``env`` (plan cache cleared before and after: the EPI switch is
    read when a signature's plan is built), checked by ``ref_check(r)`` (True = passed), then timed (whole call)."""
    from deepkernels.gemm import grouped
    old = {k: os.environ.get(k) for k in env}
    os.environ.update(env)
    grouped._PLANS.clear()
    try:
        fn()
        torch.cuda.synchronize()
        if ref_check(r):
            _time_variant(r, fn, row, flops, graph=False)
        else:
            r["error"] = "failed its check: not timed"
    except Exception as e:
        r["error"] = f"{type(e).__name__}: {str(e)[:300]}"
    finally:
        for k, v in old.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
        grouped._PLANS.clear()


def _gluon_contiguous(row, A, B, d, gl, ref_full, flops):
    """v3: the Gluon warp-specialised m-grouped contiguous kernel (direct launcher), each config checked
    (NaN-poisoned output, padding rows exactly 0, calc_diff vs the dequantized product) before it is timed."""
    from deepkernels.gemm import _gluon_fp8 as G
    from deepkernels.testing import calc_diff
    if not G.available():
        row["gluon"] = {"error": repr(G._IMPORT_ERROR)[:200]}
        return
    ref = ref_full()
    pad = (gl < 0) | (gl >= B[0].shape[0])
    out = row["gluon"] = {}
    cfgs = [G.GLUON_WS_128_S6, G.GLUON_WS_128_S6_EPI] if _epi_ab() else \
        [G.GLUON_WS_128_S6, G.GLUON_WS_128_S6_PF, G.GLUON_WS_128_S6_EPI]
    fns, twin = {}, {}
    for cfg in cfgs:
        r = out[cfg.name()] = {}
        try:
            fn = lambda cfg=cfg: G._launch_fp8_gluon_m_contiguous(A[0], A[1], B[0], B[1], d, gl, cfg)  # noqa: E731
            d.fill_(float("nan"))
            fn()
            torch.cuda.synchronize()
            r["nan"] = bool(torch.isnan(d).any())
            r["pad_zero"] = bool((d[pad] == 0).all())
            r["diff"] = float(calc_diff(torch.nan_to_num(d.float(), nan=1e4), ref))
            if cfg is G.GLUON_WS_128_S6:
                twin["out"] = d.clone()
            elif cfg.epi_tma:
                r["bit_identical"] = _same_bits(d, twin["out"]) if "out" in twin else None
            if r["nan"] or not r["pad_zero"] or r["diff"] > 1e-3 or r.get("bit_identical") is False:
                r["error"] = "failed its check: not timed"
                continue
            fns[cfg.name()] = fn
        except Exception as e:
            r["error"] = f"{type(e).__name__}: {str(e)[:300]}"
    _time_checked(out, fns, row, flops)
    _vs_register(out, [(G.GLUON_WS_128_S6, G.GLUON_WS_128_S6_EPI)])
    import deepkernels as dk
    fn = lambda: dk.m_grouped_fp8_gemm_nt_contiguous(A, B, d, gl)  # noqa: E731

    def check(r):
        r["diff"] = float(calc_diff(torch.nan_to_num(d.float(), nan=1e4), ref))
        r["nan"] = bool(torch.isnan(d).any())
        if "out" in twin:
            r["bit_identical"] = _same_bits(d, twin["out"])
        return not r["nan"] and r["diff"] <= 1e-3 and r.get("bit_identical") is not False
    # the public op routed through the Gluon kernel (DEEPKERNELS_GROUPED_GLUON=1: whole-call dispatch path), and
    # with the TMA-store-epilogue switch on top (DEEPKERNELS_GROUPED_EPI=1)
    variants = [("public_gluon_epi", {"DEEPKERNELS_GROUPED_EPI": "1"})]
    if not _epi_ab():
        variants.insert(0, ("public_gluon", {"DEEPKERNELS_GROUPED_EPI": "0"}))
    for name, env in variants:
        d.fill_(float("nan"))
        _public_env(dict(env, DEEPKERNELS_GROUPED_GLUON="1"), fn, out.setdefault(name, {}), check, row, flops)


def run_masked(g, m, n, k, device, dry, m_max=MASKED_M_MAX):
    import deepkernels as dk
    m_max = max(m, m_max if not dry else m)
    a = torch.randn(g, m_max, k, device=device, dtype=torch.bfloat16)
    from deepkernels.quant import per_token_cast_to_fp8
    q = [per_token_cast_to_fp8(a[i]) for i in range(g)]
    A = (torch.stack([x[0] for x in q]), torch.stack([x[1] for x in q]))
    B = fp8_weights(g, n, k, device)
    masked_m = torch.full((g,), m, dtype=torch.int32, device=device)
    d = torch.empty(g, m_max, n, dtype=torch.bfloat16, device=device)
    d_cublas = torch.zeros_like(d)
    a_slices = [(A[0][i, :m], A[1][i, :m]) for i in range(g)]
    out_slices = [d_cublas[i, :m] for i in range(g)]
    flops = 2 * g * m * n * k
    byts = int(nbytes(A[0], A[1], d) * (g * m) / (g * m_max)) + nbytes(B[0], B[1])
    row = {"op": "m_grouped_fp8_gemm_nt_masked", "kind": "masked", "g": g, "m_per_group": m, "n": n, "k": k,
           "m_max": m_max, "flops": flops, "bytes": byts}
    deq = _dequant_ref(a_slices, B, None)

    def ref_full():
        full = torch.full((g, m_max, n), float("nan"), device=device)
        for i, o in enumerate(deq()):
            full[i, :m] = o
        return full[:, :m]
    ours = lambda: dk.m_grouped_fp8_gemm_nt_masked(A, B, d, masked_m, m)  # noqa: E731

    class _View:  # calc_diff over the valid rows only
        def __init__(self, t):
            self.t = t

        def fill_(self, v):
            self.t.fill_(v)

        def float(self):
            return self.t[:, :m].float()
    _time_pair(row, ours, cublas_loop(a_slices, B, out_slices), _View(d), _View(d_cublas), ref_full, dry)
    _ratio_fields(row, flops, byts, ("masked", g, m, n, k))
    if not dry and os.environ.get("GROUPED_BENCH_GLUON", "1") == "1":
        _gluon_masked(row, A, B, d, masked_m, m, ref_full, flops)
    return row


def _gluon_masked(row, A, B, d, masked_m, m, ref_full, flops):
    """The Gluon warp-specialised masked kernel through its direct launcher (configs s4 and s6; the public op
    dispatches s4 for expected_m >= 256, N >= 4096, K >= 2048), checked (rows < m equal the dequantized product,
    rows >= m left NaN) before it is timed; ``vs_public`` = the public op's time (``row["us"]``) / this one's."""
    from deepkernels.gemm import _gluon_fp8 as G
    from deepkernels.testing import calc_diff
    if not G.available():
        return
    ref = ref_full()
    out = row["gluon"] = {}
    cfgs = [G.GLUON_WS_128_S4, G.GLUON_WS_128_S4_EPI] if _epi_ab() else \
        [G.GLUON_WS_128_S4, G.GLUON_WS_128_S6, G.GLUON_WS_128_S4_EPI, G.GLUON_WS_128_S6_EPI]
    fns, twins = {}, {}

    def check(r, twin=None):
        r["untouched"] = bool(torch.isnan(d[:, m:]).all())
        r["nan"] = bool(torch.isnan(d[:, :m]).any())
        r["diff"] = float(calc_diff(torch.nan_to_num(d[:, :m].float(), nan=1e4), ref))
        if twin is not None:
            r["bit_identical"] = _same_bits(d, twin)
        return not r["nan"] and r["untouched"] and r["diff"] <= 1e-3 and r.get("bit_identical") is not False
    for cfg in cfgs:
        r = out[cfg.name()] = {}
        try:
            fn = lambda cfg=cfg: G._launch_fp8_gluon_m_masked(A[0], A[1], B[0], B[1], d, masked_m, cfg)  # noqa: E731
            d.fill_(float("nan"))
            fn()
            torch.cuda.synchronize()
            ok = check(r, twins.get(cfg.num_stages) if cfg.epi_tma else None)
            if not cfg.epi_tma:
                twins[cfg.num_stages] = d.clone()
            if not ok:
                r["error"] = "failed its check: not timed"
                continue
            fns[cfg.name()] = fn
        except Exception as e:
            r["error"] = f"{type(e).__name__}: {str(e)[:300]}"
    _time_checked(out, fns, row, flops)
    _vs_register(out, [(G.GLUON_WS_128_S4, G.GLUON_WS_128_S4_EPI), (G.GLUON_WS_128_S6, G.GLUON_WS_128_S6_EPI)])
    # the public op with the TMA-store-epilogue switch (DEEPKERNELS_GROUPED_EPI=1); without it the public op (row
    # "us") already runs GLUON_WS_128_S4 at these shapes
    import deepkernels as dk
    fn = lambda: dk.m_grouped_fp8_gemm_nt_masked(A, B, d, masked_m, m)  # noqa: E731
    d.fill_(float("nan"))
    _public_env({"DEEPKERNELS_GROUPED_EPI": "1"}, fn, out.setdefault("public_epi", {}),
                lambda r: check(r, twins.get(4)), row, flops)


def run_ab(args) -> dict:
    """Drift-robust A/B of the m-grouped contiguous public op: Triton (with and without the per-call MN-major sfa
    copy, grouped._CONTIG_SFA_COPY) vs the Gluon dispatch (DEEPKERNELS_GROUPED_GLUON 0/1). Every variant is checked
    first (NaN-poisoned d, padding rows exactly 0, calc_diff vs the dequantized product); then ROUNDS rounds in
    which every variant is timed once (whole call, do_bench median), so slow clock/thermal drift hits all variants
    alike; the per-variant median over rounds and one CUDA-graph time are reported."""
    import deepkernels as dk
    from deepkernels.gemm import grouped
    from deepkernels.testing import calc_diff
    import triton.testing
    rounds = 3
    dev = getattr(args, "ab_device", "cuda")  # "cpu" only for a smoke run of this function under the interpreter
    # the Gluon path reads sfa as given (never copies), so _CONTIG_SFA_COPY only changes the Triton variants
    variants = {"triton": ("0", True), "triton_nocopy": ("0", False), "gluon": ("1", True)}
    result = {"provenance": provenance(), "mode": "ab", "rounds": rounds, "rows": []}
    shapes = [(g, m, n, k, "contiguous", None) for g, m, n, k in CONTIGUOUS]
    counts = moe_counts(MOE["experts"], MOE["rows"])
    shapes += [(MOE["experts"], MOE["rows"] // MOE["experts"], n, k, f"moe_v3_{nm}", counts) for nm, n, k in MOE["shapes"]]
    for g, m, n, k, label, cnt in shapes:
        torch.manual_seed(0)
        cnt = cnt or [m] * g
        layout, starts = [], []
        for i, c in enumerate(cnt):
            starts.append(len(layout))
            layout += [i] * c + [-1] * (-(-c // 128) * 128 - c)
        gl = torch.tensor(layout, dtype=torch.int32, device=dev)
        A = fp8_rows(gl.numel(), k, dev)
        B = fp8_weights(g, n, k, dev)
        d = torch.empty(gl.numel(), n, dtype=torch.bfloat16, device=dev)
        deq = _dequant_ref([(A[0][s:s + c], A[1][s:s + c]) for s, c in zip(starts, cnt)], B, None)()
        ref = torch.zeros(gl.numel(), n, device=dev)
        for (s, c), o in zip(zip(starts, cnt), deq):
            ref[s:s + c] = o
        del deq
        flops = 2 * sum(cnt) * n * k
        row = {"kind": label, "g": g, "m_per_group": m, "n": n, "k": k, "flops": flops, "variants": {}}
        fn = lambda: dk.m_grouped_fp8_gemm_nt_contiguous(A, B, d, gl)  # noqa: E731

        def setv(v):
            os.environ["DEEPKERNELS_GROUPED_GLUON"], grouped._CONTIG_SFA_COPY = variants[v]
        ok = []
        for v in variants:
            setv(v)
            r = row["variants"][v] = {"us_rounds": []}
            try:
                d.fill_(float("nan"))
                fn()
                if dev == "cuda":
                    torch.cuda.synchronize()
                r["diff"] = float(calc_diff(torch.nan_to_num(d.float(), nan=1e4), ref))
                r["pad_zero"] = bool((d[gl < 0] == 0).all())
                r["nan"] = bool(torch.isnan(d).any())
                if r["nan"] or not r["pad_zero"] or r["diff"] > 1e-3:
                    r["error"] = "failed its check: not timed"
                else:
                    ok.append(v)
            except Exception as e:
                r["error"] = f"{type(e).__name__}: {str(e)[:300]}"
        for _ in range(rounds):
            for v in ok:
                setv(v)
                row["variants"][v]["us_rounds"].append(triton.testing.do_bench(fn, warmup=5, rep=40,
                                                                               return_mode="median") * 1e3)
        for v in ok:
            setv(v)
            r = row["variants"][v]
            r["us"] = sorted(r["us_rounds"])[len(r["us_rounds"]) // 2]
            r["tflops"] = flops / r["us"] / 1e6
            r["graph_us"] = bench_graph(fn, False)
        base = row["variants"].get("triton", {}).get("us")
        for v in ok:
            if base:
                row["variants"][v]["vs_triton"] = base / row["variants"][v]["us"]
        result["rows"].append(row)
        print(f"{label} G={g} m={m} n={n} k={k}: " + "  ".join(
            f"{v} {r.get('us', float('nan')):.1f}us/{r.get('graph_us') or float('nan'):.1f}g x{r.get('vs_triton', float('nan')):.3f}"
            f"{' ERR' if r.get('error') else ''}" for v, r in row["variants"].items()), flush=True)
        if args.out:
            with open(args.out, "w") as f:
                json.dump(result, f, indent=1)
        del A, B, d, ref
        if dev == "cuda":
            torch.cuda.empty_cache()
    os.environ.pop("DEEPKERNELS_GROUPED_GLUON", None)
    grouped._CONTIG_SFA_COPY = True
    return result


def moe_counts(experts, rows, seed=0):
    """Zipf-skewed (exponent 1.0) expert loads, shuffled, summing to ``rows``; every expert gets >= 1 row."""
    gen = torch.Generator().manual_seed(seed)
    p = 1.0 / torch.arange(1, experts + 1, dtype=torch.float64)
    p = p[torch.randperm(experts, generator=gen)]
    counts = torch.multinomial(p, rows - experts, replacement=True, generator=gen).bincount(minlength=experts) + 1
    return counts.tolist()


def run(args) -> dict:
    dry = args.dry_run
    device = "cpu" if dry else "cuda"
    only = set(args.only.split(",")) if args.only else {"contiguous", "masked", "moe"}
    result = {"provenance": provenance(), "rows": [], "args": vars(args)}

    def save():
        if args.out:
            with open(args.out, "w") as f:
                json.dump(result, f, indent=1)

    def add(fn, *a, **kw):
        torch.manual_seed(hash(a) % 2**31)
        try:
            row = fn(*a, device=device, dry=dry, **kw)
        except Exception as e:
            row = {"op": fn.__name__, "shape": list(a), "error": f"{type(e).__name__}: {str(e)[:300]}"}
        result["rows"].append(row)
        print(line(row), flush=True)
        save()
        if not dry:
            torch.cuda.empty_cache()

    if "contiguous" in only:
        for s in (CONTIGUOUS if not dry else [(3, 40, 64, 256)]):
            add(run_contiguous, *s)
    if "masked" in only:
        for s in (MASKED if not dry else [(2, 24, 64, 256)]):
            add(run_masked, *s)
    if "moe" in only:
        experts, rows = (MOE["experts"], MOE["rows"]) if not dry else (5, 70)
        counts = moe_counts(experts, rows)
        for name, n, k in (MOE["shapes"] if not dry else [("up", 64, 256)]):
            add(run_contiguous, experts, rows // experts, n, k, label=f"moe_v3_{name}", counts=counts)
    ratios = [r["ratio_vs_cublas"] for r in result["rows"] if r.get("ratio_vs_cublas")]
    pubs = [r["ratio_vs_published"] for r in result["rows"] if r.get("ratio_vs_published")]
    result["geomean_vs_cublas"] = _geo(ratios)
    result["geomean_vs_deepgemm_published"] = _geo(pubs)
    save()
    return result


def _geo(xs):
    return math.exp(sum(map(math.log, xs)) / len(xs)) if xs else None


def line(r) -> str:
    f = lambda key, fmt="7.1f": format(r[key], fmt) if isinstance(r.get(key), (int, float)) else "   n/a"  # noqa: E731
    shape = f"G={r.get('g')} m={r.get('m_per_group')} n={r.get('n')} k={r.get('k')}"
    s = (f"{r.get('kind', r.get('op')):<13} {shape:<32} ours {f('us', '9.1f')} us {f('tflops')} TF {f('gbps', '7.0f')} "
         f"GB/s | cuBLAS loop {f('cublas_us', '9.1f')} us x{f('ratio_vs_cublas', '5.2f')} | "
         f"DeepGEMM {f('deepgemm_published_tflops', '5.0f')} TF x{f('ratio_vs_published', '5.2f')}")
    if r.get("graph_us"):
        s += f" | graph {r['graph_us']:.1f} us"
    if r.get("diff_vs_dequant") is not None:
        s += f" | diff {r['diff_vs_dequant']:.1e}"
    for name, x in (r.get("gluon") or {}).items():
        if isinstance(x, dict):
            s += (f"\n    {name}: {x.get('us', float('nan')):.1f} us (graph {x.get('graph_us') or float('nan'):.1f}) "
                  f"{x.get('tflops', float('nan')):.0f} TF x{x.get('vs_public', float('nan')):.2f} vs public op "
                  f"x{x.get('vs_cublas', float('nan')):.2f} vs cuBLAS diff {x.get('diff', float('nan')):.1e}"
                  f"{'' if x.get('bit_identical') is None else ' bit-identical ' + str(x['bit_identical'])}"
                  f"{' x%.3f vs register epi' % x['vs_register'] if x.get('vs_register') else ''}"
                  f"{' ERROR ' + x['error'] if x.get('error') else ''}")
    if r.get("error"):
        s += f" | ERROR {r['error']}"
    if r.get("cublas_note"):
        s += f" | cuBLAS: {r['cublas_note']}"
    return s


def summary(result: dict) -> None:
    print("provenance:", json.dumps(result.get("provenance", {})))
    for r in result.get("rows", []):
        print(line(r))
    g1, g2 = result.get("geomean_vs_cublas"), result.get("geomean_vs_deepgemm_published")
    print(f"geomean vs per-group cuBLAS: {g1:.2f}x" if g1 else "geomean vs per-group cuBLAS: n/a")
    print(f"geomean vs DeepGEMM published (target >= 1.0): {g2:.2f}x" if g2 else "geomean vs DeepGEMM published: n/a")


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", help="JSON output path")
    ap.add_argument("--dry-run", action="store_true", help="tiny shapes on the CPU (checks the script itself)")
    ap.add_argument("--only", help="comma list of contiguous,masked,moe")
    ap.add_argument("--summary", help="print the summary table of an existing JSON and exit")
    ap.add_argument("--ab", action="store_true", help="interleaved A/B of the contiguous dispatch variants (GPU)")
    args = ap.parse_args()
    if args.ab:
        run_ab(args)
        return
    if args.summary:
        try:
            with open(args.summary) as f:
                summary(json.load(f))
        except (OSError, ValueError) as e:
            print(f"no benchmark results in {args.summary}: {e}")
        return
    if not args.dry_run and not torch.cuda.is_available():
        sys.exit("needs a CUDA device (or --dry-run)")
    summary(run(args))


if __name__ == "__main__":
    main()
