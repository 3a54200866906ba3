"""In-kernel timeline of the dispatched sparse MLA decode kernel at h_q 128 (the 2-CTA cluster kernel,
``deepkernels.mla._gluon_sparse_decode_ws3``, its TIMELINE entry through the launcher keyword ``timeline=``): where the
per-request fixed cost goes (launch ramp, metadata + start cluster barrier, Q load, first K block, epilogue, end
cluster barrier) and how evenly the CTAs end. Session 21; prediction in benchmarks/notes/sparse_decode_timeline.md.

Rows :data:`ROWS`: V3.2 and V4.1, h_q 128, topk 2048, (b, s_q) = (64, 1), (128, 1), (128, 2). Inputs as the public
op's bench case (``deepkernels.bench.cases_mla._sparse_decode_case(fmt, b, s_q, 128, 2048, 1024, ...).setup()``:
1024 pages of 64 tokens, unique random indices per row with the last 1/32 set to -1) and the public op's schedule
(``sparse_decode_config`` SM parts, ``_token_counts``, ``compute_schedule`` with FIXED_OVERHEAD_BLOCKS and the greedy
algorithm where ``sparse_decode._use_greedy``); launches ``launch_sparse_decode_gluon_ws3`` directly (its dispatched
knobs: ``WS3_MAIN_TUNED`` etc. applied by the launcher itself), main kernel + combine.

Per row: (1) plain and instrumented launch once each on NaN-poisoned out / lse (must be bit-identical), and the
public op once (must equal the plain launch: same kernel, same schedule); (2) ``--reps`` instrumented launches, each
after an L2 flush, analysed by :func:`analyse`; (3) the instrumentation's cost: plain / timeline / plain again (A/A) in
``--rounds`` rotated rounds of ``do_bench`` medians, paired ratios t / t_plain. JSON rewritten after every row; raw
buffers in ``<out>.npz``.

Usage (GPU): ``PYTHONPATH=src python benchmarks/sparse_decode_timeline.py OUT.json [--reps 5] [--rounds 5]
[--rep-ms 10] [--only v41:128:2,...]``; without CUDA it prints a note and exits 0; ``--selftest`` analyses a synthetic
buffer (CPU).
"""
from __future__ import annotations

import argparse
import json
import os
import random
import sys

import numpy as np
import torch

H_Q, TOPK, NUM_BLOCKS = 128, 2048, 1024
ROWS = [("v32", 64, 1), ("v41", 64, 1), ("v32", 128, 1), ("v41", 128, 1), ("v32", 128, 2), ("v41", 128, 2)]
TL_HEADER, TL_PIECE, TL_MAX_PIECES = 16, 8, 30     # mirrors deepkernels.mla._gluon_sparse_decode_ws2 (checked)
TL_WORDS = TL_HEADER + TL_PIECE * TL_MAX_PIECES
# header words
H_ENTRY, H_STARTED, H_LOOP_DONE, H_END, H_PV_DONE, H_PROD_START, H_PROD_DONE = 0, 1, 2, 3, 4, 5, 6
H_SMID, H_RANK, H_PIECES, H_CLK0, H_CLK1, H_HBSI = 7, 8, 9, 10, 11, 12


# ------------------------------------------------------------------------------------------------ analysis (CPU)
# the generic helpers of the dense decode timeline bench (same statistics / fit / formatting)
from mla_decode_timeline import _f, _lstsq, _med, _stats  # noqa: E402


def decode(buf: np.ndarray) -> tuple[dict, list]:
    """Raw ``[CTAs, TL_WORDS]`` int64 buffer -> (header arrays, pieces: one dict per recorded piece)."""
    buf = np.asarray(buf, dtype=np.int64)
    hdr = dict(entry=buf[:, H_ENTRY], started=buf[:, H_STARTED], loop_done=buf[:, H_LOOP_DONE], end=buf[:, H_END],
               pv_done=buf[:, H_PV_DONE], prod_start=buf[:, H_PROD_START], prod_done=buf[:, H_PROD_DONE],
               smid=buf[:, H_SMID], rank=buf[:, H_RANK], npieces=buf[:, H_PIECES], clk0=buf[:, H_CLK0],
               clk1=buf[:, H_CLK1], hb=buf[:, H_HBSI] & 0xFFFFFFFF, si=(buf[:, H_HBSI] >> 32) & 0xFFFFFFFF)
    pieces = []
    for c in range(buf.shape[0]):
        for p in range(int(min(max(hdr["npieces"][c], 0), TL_MAX_PIECES))):
            r = buf[c, TL_HEADER + TL_PIECE * p: TL_HEADER + TL_PIECE * (p + 1)]
            tr, sp = int(r[6]), int(r[7])
            t_lo, t_end = tr & 0xFFFFFFFF, (tr >> 32) & 0xFFFFFFFF
            pieces.append(dict(cta=c, p=p, ps=int(r[0]), q=int(r[1]), fk=int(r[2]), le=int(r[3]), pe=int(r[4]),
                               req=int(r[5]), t_lo=t_lo, t_end=t_end, blocks=max(-(-(t_end - t_lo) // 64), 0),
                               nsp=sp & 0xFFFFFFFF, split=(sp >> 32) & 0xFFFFFFFF))
    return hdr, pieces


def analyse(buf: np.ndarray) -> dict:
    """Timeline metrics of one instrumented launch (times in us; absolute ones from the first CTA entry).

    Per CTA (softmax warpgroup's chain): entry -> start barrier passed (``start``), then per piece: gap (previous
    piece's epilogue done, or the start barrier, -> piece start), Q wait (piece start -> Q in shared memory), first K
    (Q -> first block ready), token loop (first block ready -> last block done; per block = loop / blocks), epilogue
    (last block done -> stores issued); after the last piece: loop exit (-> request loop done) and the end cluster
    barrier (-> CTA end). ``fixed`` = everything but the token loops."""
    hdr, pieces = decode(buf)
    n = buf.shape[0]
    entry, started, loop_done, end = hdr["entry"], hdr["started"], hdr["loop_done"], hdr["end"]
    ok = (entry > 0) & (started >= entry) & (loop_done >= started) & (end >= loop_done)
    out = dict(ctas=int(n), ctas_recorded=int(ok.sum()), pieces_recorded=len(pieces),
               pieces_over_cap=int((hdr["npieces"] > TL_MAX_PIECES).sum()),
               ctas_without_pieces=int(((hdr["npieces"] <= 0) & ok).sum()))
    if not ok.any():
        return out
    t0 = int(entry[ok].min())
    us = lambda x: (np.asarray(x, float) - t0) / 1e3          # noqa: E731
    e_us, s_us = us(end[ok]), us(entry[ok])
    busy = e_us - s_us
    makespan = float(e_us.max())
    out.update(makespan_us=makespan, ramp_us=float(s_us.max() - s_us.min()), entry_us=_stats(s_us),
               end_us=_stats(e_us), busy_us=_stats(busy), tail_us=float(e_us.max() - np.median(e_us)),
               end_spread_us=float(e_us.max() - e_us.min()),
               start_barrier_us=_stats((started[ok] - entry[ok]) / 1e3),
               end_barrier_us=_stats((end[ok] - loop_done[ok]) / 1e3),
               pv_done_before_loop_done_us=_stats((loop_done[ok] - hdr["pv_done"][ok]) / 1e3),
               producer_done_before_loop_done_us=_stats((loop_done[ok] - hdr["prod_done"][ok]) / 1e3),
               producer_start_after_started_us=_stats((hdr["prod_start"][ok] - started[ok]) / 1e3),
               idle_fraction=float(1 - busy.sum() / (len(busy) * makespan)) if makespan > 0 else None)
    out["busy_below"] = {f"{int(x * 100)}%": int((busy < x * makespan).sum()) for x in (0.8, 0.9, 0.95, 0.98)}
    by_cta = {}
    for pc in pieces:
        by_cta.setdefault(pc["cta"], []).append(pc)
    ph = {k: [] for k in ("gap_first", "gap_later", "q_first", "q_later", "fk_first", "fk_later", "epi_single",
                          "epi_split", "per_block", "loop")}
    one_piece = {k: [] for k in ("start", "q", "fk", "loop", "epi", "exit", "end_barrier", "fixed", "blocks")}
    cta_rows = []
    for c in np.nonzero(ok)[0]:
        prev = int(started[c])
        blocks = splits = 0
        fixed = loop_sum = 0.0
        plist = sorted(by_cta.get(int(c), []), key=lambda d: d["p"])
        for pc in plist:
            g, qw, fk = (pc["ps"] - prev) / 1e3, (pc["q"] - pc["ps"]) / 1e3, (pc["fk"] - pc["q"]) / 1e3
            lp, ep = (pc["le"] - pc["fk"]) / 1e3, (pc["pe"] - pc["le"]) / 1e3
            first = pc["p"] == 0
            ph["gap_first" if first else "gap_later"].append(g)
            ph["q_first" if first else "q_later"].append(qw)
            ph["fk_first" if first else "fk_later"].append(fk)
            ph["epi_split" if pc["nsp"] > 1 else "epi_single"].append(ep)
            ph["loop"].append(lp)
            if pc["blocks"]:
                ph["per_block"].append(lp / pc["blocks"])
            blocks += pc["blocks"]
            splits += int(pc["nsp"] > 1)
            fixed += g + qw + fk + ep
            loop_sum += lp
            prev = pc["pe"]
        exit_us = (int(loop_done[c]) - prev) / 1e3
        start_us = (int(started[c]) - int(entry[c])) / 1e3
        endb = (int(end[c]) - int(loop_done[c])) / 1e3
        fixed_all = start_us + fixed + exit_us + endb
        if len(plist) == 1:
            pc = plist[0]
            for k, v in (("start", start_us), ("q", (pc["q"] - pc["ps"]) / 1e3), ("fk", (pc["fk"] - pc["q"]) / 1e3),
                         ("loop", (pc["le"] - pc["fk"]) / 1e3), ("epi", (pc["pe"] - pc["le"]) / 1e3),
                         ("exit", exit_us), ("end_barrier", endb), ("fixed", fixed_all), ("blocks", pc["blocks"])):
                one_piece[k].append(v)
        e = float(us(end[c]))
        cta_rows.append(dict(cta=int(c), smid=int(hdr["smid"][c]), rank=int(hdr["rank"][c]), hb=int(hdr["hb"][c]),
                             si=int(hdr["si"][c]), entry=float(us(entry[c])), end=e, busy=e - float(us(entry[c])),
                             pieces=int(hdr["npieces"][c]), blocks=blocks, splits=splits, fixed=fixed_all,
                             loop=loop_sum, start=start_us, exit=exit_us, end_barrier=endb))
    blk_med = float(np.median(ph["per_block"])) if ph["per_block"] else float("nan")
    out["piece_us"] = {k: _stats(v) for k, v in ph.items()}
    out["one_piece_ctas_us"] = {k: _stats(v) for k, v in one_piece.items()}
    if cta_rows:
        col = lambda k: np.asarray([r[k] for r in cta_rows], float)   # noqa: E731
        busy_c, end_c, blocks_c, pieces_c = col("busy"), col("end"), col("blocks"), col("pieces")
        out["cta"] = dict(pieces=_stats(pieces_c), blocks=_stats(blocks_c), splits=_stats(col("splits")),
                          fixed_us=_stats(col("fixed")), loop_us=_stats(col("loop")),
                          fit_busy=_lstsq(busy_c, dict(blocks=blocks_c, pieces=pieces_c, splits=col("splits"))),
                          fit_end=_lstsq(end_c, dict(blocks=blocks_c, pieces=pieces_c)))
        mean_entry, mean_busy = float(col("entry").mean()), float(busy_c.mean())
        out["decomposition_us"] = dict(mean_entry_offset=mean_entry, mean_busy=mean_busy,
                                       mean_fixed=float(col("fixed").mean()), mean_loop=float(col("loop").mean()),
                                       mean_blocks_x_per_block=float((blocks_c * blk_med).mean()),
                                       imbalance=makespan - mean_entry - mean_busy)
        out["by_end"] = sorted(cta_rows, key=lambda r: -r["end"])[:5]
        # the two CTAs of a cluster (ctaid 2k, 2k+1): loop-done skew and who waits at the end barrier
        if n % 2 == 0 and ok.all():
            ld = loop_done.reshape(-1, 2) / 1e3
            en = entry.reshape(-1, 2) / 1e3
            out["cluster_pairs_us"] = dict(loop_done_skew=_stats(ld.max(1) - ld.min(1)),
                                           entry_skew=_stats(en.max(1) - en.min(1)),
                                           rank_ok=bool((hdr["rank"].reshape(-1, 2) == np.array([0, 1])).all()))
    stamps = np.concatenate([entry[ok], end[ok]] + [np.asarray([pc[k] for pc in pieces], np.int64)
                                                    for k in ("ps", "q", "fk", "le", "pe")])
    stamps = np.unique(stamps[stamps > 0])
    d = np.diff(stamps)
    out["globaltimer"] = dict(min_step_ns=int(d[d > 0].min()) if (d > 0).any() else None,
                              frac_multiple_of_32=float((stamps % 32 == 0).mean()) if len(stamps) else None,
                              frac_multiple_of_1000=float((stamps % 1000 == 0).mean()) if len(stamps) else None)
    dt = (loop_done[ok] - entry[ok]).astype(float)
    dc = (hdr["clk1"][ok] - hdr["clk0"][ok]).astype(float)
    good = (dt > 0) & (dc > 0)
    out["sm_clock_mhz"] = _stats(dc[good] / dt[good] * 1e3) if good.any() else dict(n=0)
    return out


def monotone_violations(buf: np.ndarray) -> list:
    """Per CTA, the softmax warpgroup's stamps in program order (entry, start barrier, each piece's 5 stamps, loop
    done, end) must not decrease, and the PV / producer loop-done stamps must not exceed the CTA end; returns
    ``(cta, what)`` for each violation (empty: monotone)."""
    hdr, pieces = decode(buf)
    by_cta = {}
    for pc in pieces:
        by_cta.setdefault(pc["cta"], []).append(pc)
    bad = []
    for c in range(buf.shape[0]):
        seq = [("entry", hdr["entry"][c]), ("started", hdr["started"][c])]
        for pc in sorted(by_cta.get(c, []), key=lambda d: d["p"]):
            seq += [(f"p{pc['p']}.{k}", pc[k]) for k in ("ps", "q", "fk", "le", "pe")]
        seq += [("loop_done", hdr["loop_done"][c]), ("end", hdr["end"][c])]
        for (na, a), (nb, b) in zip(seq, seq[1:]):
            if not (0 < a <= b):
                bad.append((c, f"{na}={a} > {nb}={b}"))
        for k in ("pv_done", "prod_start", "prod_done"):
            if not (0 < hdr[k][c] <= hdr["end"][c]):
                bad.append((c, f"{k}={hdr[k][c]} vs end={hdr['end'][c]}"))
    return bad


KEYS = {"makespan_us": ("makespan_us", ), "ramp_us": ("ramp_us", ), "tail_us": ("tail_us", ),
        "end_spread_us": ("end_spread_us", ),
        "busy_min_us": ("busy_us", "min"), "busy_median_us": ("busy_us", "median"), "busy_max_us": ("busy_us", "max"),
        "below_95": ("busy_below", "95%"),
        "start_barrier_us": ("start_barrier_us", "median"), "end_barrier_us": ("end_barrier_us", "median"),
        "end_barrier_max_us": ("end_barrier_us", "max"),
        "gap_first_us": ("piece_us", "gap_first", "median"), "gap_later_us": ("piece_us", "gap_later", "median"),
        "q_first_us": ("piece_us", "q_first", "median"), "q_later_us": ("piece_us", "q_later", "median"),
        "fk_first_us": ("piece_us", "fk_first", "median"), "fk_later_us": ("piece_us", "fk_later", "median"),
        "epi_single_us": ("piece_us", "epi_single", "median"), "epi_split_us": ("piece_us", "epi_split", "median"),
        "per_block_us": ("piece_us", "per_block", "median"),
        "one_fixed_us": ("one_piece_ctas_us", "fixed", "median"), "one_n": ("one_piece_ctas_us", "fixed", "n"),
        "one_exit_us": ("one_piece_ctas_us", "exit", "median"),
        "fixed_per_cta_us": ("decomposition_us", "mean_fixed"), "imbalance_us": ("decomposition_us", "imbalance"),
        "mean_entry_offset_us": ("decomposition_us", "mean_entry_offset"),
        "fit_block_us": ("cta", "fit_busy", "blocks"), "fit_piece_us": ("cta", "fit_busy", "pieces"),
        "fit_split_us": ("cta", "fit_busy", "splits"), "fit_r2": ("cta", "fit_busy", "r2"),
        "pair_skew_us": ("cluster_pairs_us", "loop_done_skew", "median"),
        "pair_skew_max_us": ("cluster_pairs_us", "loop_done_skew", "max"),
        "pv_before_loop_done_us": ("pv_done_before_loop_done_us", "median"),
        "producer_before_loop_done_us": ("producer_done_before_loop_done_us", "median"),
        "timer_min_step_ns": ("globaltimer", "min_step_ns"), "sm_clock_mhz": ("sm_clock_mhz", "median")}


def summarize(reps: list) -> dict:
    return {k: _med(reps, p) for k, p in KEYS.items()}


def synthetic(n_parts=6, s_q=1, block_ns=2600, seed=0) -> np.ndarray:
    """A fabricated buffer with known phase costs (the CPU self-test of :func:`analyse`): per CTA start barrier 1 us,
    per piece gap 0.1, Q 1.5 (first) / 0.2, first K 2.0 / 0.3, ``block_ns`` per block, epilogue 3 us, exit 0.1,
    end barrier 0.5; the two CTAs of a cluster identical but for a 0.2 us later entry of rank 1."""
    rng = random.Random(seed)
    buf = np.zeros((n_parts * s_q * 2, TL_WORDS), np.int64)
    t_base = 10 ** 12
    for part in range(n_parts):
        npc = rng.randint(1, 4)
        blocks = [rng.randint(1, 32) for _ in range(npc)]
        for si in range(s_q):
            for r in range(2):
                c = (part * s_q + si) * 2 + r
                t = t_base + 200 * r
                buf[c, H_ENTRY] = t
                buf[c, H_CLK0] = 1000
                t += 1000
                buf[c, H_STARTED] = t
                buf[c, H_PROD_START] = t + 50
                buf[c, H_SMID], buf[c, H_RANK], buf[c, H_PIECES] = c, r, npc
                buf[c, H_HBSI] = r + (si << 32)
                for p, nb in enumerate(blocks):
                    o = TL_HEADER + TL_PIECE * p
                    t += 100
                    buf[c, o + 0] = t
                    t += 1500 if p == 0 else 200
                    buf[c, o + 1] = t
                    t += 2000 if p == 0 else 300
                    buf[c, o + 2] = t
                    t += nb * block_ns
                    buf[c, o + 3] = t
                    t += 3000
                    buf[c, o + 4] = t
                    buf[c, o + 5] = part * 10 + p
                    buf[c, o + 6] = (p * 64) + ((p * 64 + nb * 64) << 32)
                    buf[c, o + 7] = (2 if p == 0 else 1)
                t += 100
                buf[c, H_LOOP_DONE] = t
                buf[c, H_PV_DONE] = t - 50
                buf[c, H_PROD_DONE] = t - 3000
                buf[c, H_CLK1] = 1000 + (t - buf[c, H_ENTRY]) * 18 // 10        # 1.8 GHz
                buf[c, H_END] = t + 500
    return buf


# ------------------------------------------------------------------------------------------------ GPU part
def build_row(fmt, b, s_q, seed=0, device="cuda"):
    """Inputs (the public op's bench case) and the public op's schedule for one row."""
    from types import SimpleNamespace
    from deepkernels.bench.cases_mla import _sparse_decode_case
    from deepkernels.mla import sparse_decode as sd
    from deepkernels.mla.metadata import FIXED_OVERHEAD_BLOCKS, compute_schedule
    random.seed(seed)
    torch.manual_seed(seed)
    t = _sparse_decode_case(fmt, b, s_q, H_Q, TOPK, NUM_BLOCKS, device, False).setup()
    t.pop("kv_deq", None)
    parts = sd._num_sm_parts(t["q"].device, s_q, H_Q, sd.sparse_decode_config(H_Q, fmt))
    greedy = sd._use_greedy(b, parts)
    counts = sd._token_counts(b, TOPK, None, 0, None, False, t["q"].device)
    sched, ns = compute_schedule(counts, parts, FIXED_OVERHEAD_BLOCKS, algorithm="greedy" if greedy else "linear")
    d_qk = t["q"].shape[3]
    return SimpleNamespace(fmt=fmt, b=b, s_q=s_q, q=t["q"], cache=t["k_cache"], ind=t["indices"], meta=t["sched"],
                           sched=sched, ns=ns, parts=parts, greedy=greedy, scale=d_qk ** -0.5, d_qk=d_qk,
                           ctas=parts * s_q * (H_Q // 64), flop=2.0 * H_Q * b * s_q * TOPK * (d_qk + 512))


def launch_fn(c, outs, timeline=None):
    from deepkernels.mla import _gluon_sparse_decode_ws3 as W3
    kw = {} if timeline is None else dict(timeline=timeline)
    return lambda: W3.launch_sparse_decode_gluon_ws3(outs[0], outs[1], c.q, c.cache, c.ind, c.sched, c.ns, c.scale,
                                                      c.fmt, **kw)


def alloc_outs(c, poison=False):
    o = torch.empty(c.b, c.s_q, H_Q, 512, dtype=torch.bfloat16, device=c.q.device)
    lse = torch.empty(c.b, c.s_q, H_Q, dtype=torch.float32, device=c.q.device)
    if poison:
        o.fill_(float("nan"))
        lse.fill_(float("nan"))
    return o, lse


def _same(a, b) -> bool:
    return all(torch.equal(x.nan_to_num(1234.5), y.nan_to_num(1234.5)) for x, y in zip(a, b))


def parse_only(spec):
    if not spec:
        return None
    out = set()
    for it in spec.split(","):
        f, b, s = it.strip().split(":")
        out.add((f, int(b), int(s)))
    return out


def main(args) -> int:
    only = parse_only(args.only)
    if not torch.cuda.is_available():
        print("sparse_decode_timeline: no CUDA device; nothing measured", flush=True)
        return 0
    import deepkernels as dk
    from deepkernels.mla import _gluon_sparse_decode_ws2 as W2
    from deepkernels.mla import _gluon_sparse_decode_ws3 as W3
    from deepkernels.mla import sparse_decode as sd
    from deepkernels.bench.runner import provenance
    from deepkernels.bench.paired import rotation, round_stats, time_rotated
    from triton.testing import do_bench

    assert (W2.TL_HEADER, W2.TL_PIECE, W2.TL_MAX_PIECES) == (TL_HEADER, TL_PIECE, TL_MAX_PIECES)
    path = args.out
    prov = provenance()
    prov.update(mode="sparse decode timeline", reps=args.reps, rounds=args.rounds, rep_ms=args.rep_ms,
                git_sha_env=os.environ.get("GIT_SHA"), ws3_main_tuned={k: dict(v) for k, v in
                                                                       W3.WS3_MAIN_TUNED.items()},
                greedy_sched=sd._GREEDY_SCHED,
                timing=dict(method="rotated rounds of do_bench medians, launcher = main kernel + combine",
                            headline="paired_time_ratio_median (t / t_plain)"),
                note="times in us from the first CTA entry; stamps = %globaltimer, max over a partition's warps")
    rows, raw = [], {}
    flush = torch.empty(int(256e6 // 4), dtype=torch.int32, device="cuda")
    x = torch.randn(4096, 4096, device="cuda", dtype=torch.bfloat16)
    for _ in range(300):           # clocks up before the first timing
        x @ x
    del x
    for fmt, b, s_q in ROWS:
        if only is not None and (fmt, b, s_q) not in only:
            continue
        rec = dict(fmt=fmt, b=b, s_q=s_q, h_q=H_Q, topk=TOPK)
        c = o_plain = o_tl = tl = fns = None
        try:
            c = build_row(fmt, b, s_q, seed=args.seed)
            rec.update(parts=c.parts, ctas=c.ctas, greedy=bool(c.greedy), flop=c.flop,
                       pieces_total=int(c.ns[-1].item()),
                       enough_work=bool(W3.enough_work(b, TOPK, c.parts)), ws3_dispatch=bool(W3.dispatch_on(fmt)))
            tl = torch.zeros(c.ctas, TL_WORDS, dtype=torch.int64, device="cuda")
            o_plain, o_tl = alloc_outs(c, True), alloc_outs(c, True)
            launch_fn(c, o_plain)()
            launch_fn(c, o_tl, tl)()
            torch.cuda.synchronize()
            rec["bit_identical"] = _same(o_plain, o_tl)
            rec["out_nan"] = bool(torch.isnan(o_plain[0]).any())
            rec["monotone_violations"] = len(monotone_violations(tl.cpu().numpy()))
            po, pl = dk.flash_mla_with_kvcache(c.q, c.cache, None, None, 512, c.meta, is_fp8_kvcache=True,
                                               indices=c.ind)
            torch.cuda.synchronize()
            rec["equals_public_op"] = _same(o_plain, (po, pl.transpose(1, 2)))
            reps = []
            for r in range(args.reps):
                tl.zero_()
                flush.zero_()
                torch.cuda.synchronize()
                launch_fn(c, o_tl, tl)()
                torch.cuda.synchronize()
                buf = tl.cpu().numpy()
                raw[f"{fmt}_b{b}_sq{s_q}_rep{r}"] = buf
                reps.append(analyse(buf))
            rec["reps"] = reps
            rec["summary"] = summarize(reps)
            fns = {"plain": launch_fn(c, o_plain), "timeline": launch_fn(c, o_tl, tl),
                   "plain_again": launch_fn(c, o_plain)}
            errors = {}
            ms = time_rotated(fns, args.rounds, lambda f: do_bench(f, warmup=3, rep=args.rep_ms,
                                                                  return_mode="median"), errors)
            rec["timing"] = round_stats(ms, "plain")
            rec["timing_orders"] = [rotation(list(fns), r) for r in range(args.rounds)]
            if errors:
                rec["timing_errors"] = errors
            for st in rec["timing"].values():
                st["tflops"] = rec["flop"] / st["ms"] / 1e9
        except Exception as e:  # noqa: BLE001
            import traceback
            rec["failed"] = f"{type(e).__name__}: {str(e)[:300]}"
            rec["traceback"] = traceback.format_exc()[-2000:]
        rows.append(rec)
        with open(path, "w") as f:
            json.dump(dict(provenance=prov, rows=rows), f, indent=1)
        np.savez_compressed(os.path.splitext(path)[0] + ".npz", **raw)
        _print_row(rec)
        c = o_plain = o_tl = tl = fns = None     # noqa: F841 (free the row before the next)
        torch.cuda.empty_cache()
    if not rows:
        with open(path, "w") as f:
            json.dump(dict(provenance=prov, rows=rows), f, indent=1)
        print("sparse_decode_timeline: no row selected", flush=True)
    return 0


def _print_row(rec):
    head = f"{rec['fmt']} b={rec['b']:3d} s_q={rec['s_q']}"
    if "failed" in rec:
        print(f"SUMMARY {head} FAILED {rec['failed'][:200]}", flush=True)
        return
    s = rec["summary"]
    t = rec.get("timing", {})
    tl, aa = t.get("timeline", {}), t.get("plain_again", {})
    print(f"SUMMARY {head} parts {rec['parts']} ctas {rec['ctas']} greedy {int(rec['greedy'])} bitid "
          f"{int(rec['bit_identical'])} op {int(rec['equals_public_op'])} mono_bad {rec['monotone_violations']} | "
          f"makespan {_f(s['makespan_us'])} ramp {_f(s['ramp_us'], '%.2f')} tail {_f(s['tail_us'])} spread "
          f"{_f(s['end_spread_us'])} busy {_f(s['busy_min_us'])}/{_f(s['busy_median_us'])}/{_f(s['busy_max_us'])} "
          f"<95% {_f(s['below_95'], '%d')} | start {_f(s['start_barrier_us'], '%.2f')} Q "
          f"{_f(s['q_first_us'], '%.2f')}/{_f(s['q_later_us'], '%.2f')} firstK {_f(s['fk_first_us'], '%.2f')}/"
          f"{_f(s['fk_later_us'], '%.2f')} gap {_f(s['gap_first_us'], '%.2f')}/{_f(s['gap_later_us'], '%.2f')} "
          f"(first/later piece) epi {_f(s['epi_single_us'], '%.2f')}/{_f(s['epi_split_us'], '%.2f')} (single/split) "
          f"exit {_f(s['one_exit_us'], '%.2f')} endbar {_f(s['end_barrier_us'], '%.2f')} (max "
          f"{_f(s['end_barrier_max_us'], '%.2f')}) block {_f(s['per_block_us'], '%.3f')} | one-piece fixed "
          f"{_f(s['one_fixed_us'], '%.2f')} (n {_f(s['one_n'], '%d')}) fixed/CTA {_f(s['fixed_per_cta_us'])} "
          f"imbalance {_f(s['imbalance_us'])} | fit block {_f(s['fit_block_us'], '%.3f')} piece "
          f"{_f(s['fit_piece_us'], '%.2f')} split {_f(s['fit_split_us'], '%.2f')} R2 {_f(s['fit_r2'], '%.3f')} | "
          f"pair skew {_f(s['pair_skew_us'], '%.2f')} (max {_f(s['pair_skew_max_us'], '%.2f')}) PV/prod before "
          f"{_f(s['pv_before_loop_done_us'], '%.2f')}/{_f(s['producer_before_loop_done_us'], '%.2f')} timer "
          f"{_f(s['timer_min_step_ns'], '%d')}ns clk {_f(s['sm_clock_mhz'], '%.0f')} | plain "
          f"{_f(t.get('plain', {}).get('ms'), '%.4f')} ms tl/plain {_f(tl.get('paired_time_ratio_median'), '%.3f')} "
          f"A/A {_f(aa.get('paired_time_ratio_median'), '%.3f')}", flush=True)


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("out", nargs="?", default=os.path.join(os.environ.get("OUT", "/tmp"),
                                                          "sparse_decode_timeline.json"))
    p.add_argument("--reps", type=int, default=int(os.environ.get("REPS", "5")))
    p.add_argument("--rounds", type=int, default=int(os.environ.get("ROUNDS", "5")))
    p.add_argument("--rep-ms", type=int, default=int(os.environ.get("REP_MS", "10")))
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--only", default=os.environ.get("ONLY_ROWS"), help="fmt:b:s_q,... (env ONLY_ROWS)")
    p.add_argument("--selftest", action="store_true", help="analyse a synthetic buffer (CPU) and print it")
    return p.parse_args(argv)


if __name__ == "__main__":
    a = parse_args()
    if a.selftest:
        r = analyse(synthetic())
        print(json.dumps(summarize([r]), indent=1))
        sys.exit(0)
    sys.exit(main(a))
