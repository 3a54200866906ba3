"""Per-role cycles per (CTA, 64-token block) of the TUNED V4.1 WS3 sparse decode kernel (q_ahead, inline-PTX
dequant, producer setmaxnreg 144: ``WS3_MAIN_TUNED``, dispatched since git cc34511) from an ncu source export
(benchmarks/notes/mla_sparse_gluon.md "Session 20 attribution (V4.1 tuned)").

Unlike ``ncu_sparse_decode_ws3_roles.py`` (hard-coded address ranges of git f4b6ff9's build) the ranges are found in
the SASS: partitions by their ``USETMAXREG`` (PV 160, producer 144, softmax 256 -> 200), try-wait retry loops after
the final EXIT assigned to the partition they branch back to, each partition's per-block loop = the innermost
backward branch of >150 instructions executed once per CTA-block and warp (32,768 times), the producer's push
rounds = ``MEMBAR.ALL.CTA`` .. ``BRA.U.ANY``, the loop-top drain = the producer-loop instructions before the
``empty`` try-wait that wait on scoreboard 5. The local cross-compile must match the profiled SASS line for line
(up to branch-target spelling, ``.reuse`` and LDGSTS operand order). (The ``--c1`` listing of the session-20 C1_SMEM
build went with that build: measured 1.04-1.05x slower and removed; its code is at git 646a3c2.) Usage (CPU):

    PYTHONPATH=src python benchmarks/ncu_sparse_decode_ws3_tuned_roles.py \\
        benchmarks/results/ncu-h200-2026-11-30-s20b/sparse_v41.sass.csv
"""
from __future__ import annotations

import argparse
import os
import re
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "src"))
sys.path.insert(0, HERE)

from ncu_sparse_decode_ws3_roles import _norm, load_export, sass_hex  # noqa: E402

ELAPSED, BLOCKS = 304320, 62.06      # the s20b export's elapsed cycles; mean 64-token blocks per CTA (66 parts, b 128)
KNOBS = dict(q_ahead=True, deq_asm=True, producer_regs=144)


def _norm2(t: str) -> str:
    t = _norm(t)
    m = re.match(r"(LDGSTS\S*) (desc\[[^\]]*\]\[[^\]]*\]), (\[[^\]]*\])(.*)", t)
    return f"{m.group(1)} {m.group(3)}, {m.group(2)}{m.group(4)}" if m else t


def loops(sass, labels):
    """(lo, hi) of every backward branch's body, hi = the branch's offset."""
    out = []
    for o, (t, *_) in sorted(sass.items()):
        m = re.search(r"BRA `\((\.L_x_\d+)\)", t)
        if m and labels.get(m.group(1), o) < o:
            out.append((labels[m.group(1)], o))
    return out


def analyse(sass, labels, rows=None):
    off = sorted(sass)
    by = {r["off"]: r for r in rows} if rows else {}
    smp = (lambda o: by[o]["samples"]) if rows else (lambda o: 0)
    exe = (lambda o: by[o]["exe"]) if rows else (lambda o: 0)
    exits = [o for o in off if sass[o][0].endswith("EXIT") and not sass[o][0].startswith("@")]
    last_exit = exits[-1]
    alloc = [(o, int(re.search(r"0x([0-9a-f]+)$", sass[o][0]).group(1), 16)) for o in off
             if "USETMAXREG.TRY_ALLOC" in sass[o][0]]
    # partition starts: TRY_ALLOC 0xa0 (PV), 0x90 (producer), 0x100 (softmax); each ends where the next begins
    starts = sorted((o, {0xa0: "pv", 0x90: "prod", 0x100: "soft"}.get(n, "?")) for o, n in alloc)
    bounds = []
    for i, (o, role) in enumerate(starts):
        lo = 0 if i == 0 else o - 0x10      # the NOP label in front of a partition start
        hi = starts[i + 1][0] - 0x10 if i + 1 < len(starts) else last_exit + 0x10
        bounds.append((lo, hi, role))

    def role_of(o):
        for lo, hi, r in bounds:
            if lo <= o < hi:
                return r
        return None
    # retry loops after the final EXIT: TRYWAIT, @!P BRA self, BRA back
    retry = {}
    for o in off:
        if o > last_exit and "TRYWAIT" in sass[o][0]:
            back = re.search(r"BRA `\((\.L_x_\d+)\)", sass[o + 0x20][0])
            tgt = labels[back.group(1)]
            retry[o] = (role_of(tgt), tgt, exe(o + 0x20), exe(o + 0x10))

    tot = {r: sum(smp(o) for o in off if role_of(o) == r) for r in ("pv", "prod", "soft")}
    for o, (r, *_rest) in retry.items():
        tot[r] += sum(smp(x) for x in (o, o + 0x10, o + 0x20))
    res = dict(tot=tot, retry=retry, bounds=bounds)
    # per-block loops (innermost backward branch, >150 instructions, body without another loop's back branch)
    lp = loops(sass, labels)
    inner = [(lo, hi) for lo, hi in lp if hi - lo > 150 * 16
             and not any(lo <= a and b < hi and (a, b) != (lo, hi) for a, b in lp)]
    res["loops"] = {}
    for lo, hi in inner:
        r = role_of(lo)
        if r and (r not in res["loops"]):
            res["loops"][r] = (lo, hi)
    plo, phi = res["loops"]["prod"]
    body = [o for o in off if plo <= o <= phi]
    tw = [o for o in body if "TRYWAIT" in sass[o][0]][0]
    wbr = [o for o in body if o > tw and sass[o][4] and "BRA" in sass[o][0]][0]
    drain = [o for o in body if o < tw and sass[o][4] >> 5 & 1]
    pushes, cur = [], None
    for o in body:
        if "MEMBAR.ALL.CTA" in sass[o][0]:
            cur = o
        if cur is not None and "BRA.U.ANY" in sass[o][0]:
            pushes.append((cur, o + 0x10))
            cur = None
    tw_retry = [o for o, v in retry.items() if v[0] == "prod"]
    cat = {"loop-top drain (SB5 wait before the empty try-wait)": sum(smp(o) for o in drain),
           "wait empty (try-wait, its branch, retry loop)": smp(tw) + smp(wbr) + sum(
               smp(x) for o in tw_retry for x in (o, o + 0x10, o + 0x20)),
           "2 push rounds (MEMBAR .. BRA.U.ANY)": sum(smp(o) for a, b in pushes for o in body if a <= o < b)}
    rest = sum(smp(o) for o in body) - cat["loop-top drain (SB5 wait before the empty try-wait)"] - smp(tw) - smp(
        wbr) - cat["2 push rounds (MEMBAR .. BRA.U.ANY)"]
    cat["dequant, loads, index, arrives, rest of the loop"] = rest
    cat["outside the loop (per request, once)"] = tot["prod"] - sum(cat.values())
    res.update(prod_cat=cat, drain=drain, tw=tw, wbr=wbr, pushes=pushes, n_prod_loop=len(body))
    for r in ("soft", "pv"):
        lo, hi = res["loops"][r]
        res[f"{r}_loop"] = (len([o for o in off if lo <= o <= hi]), sum(smp(o) for o in off if lo <= o <= hi))
        # in-loop waits: each try-wait + the branch after it (waits on its result); wgmma waits (WARPGROUP.DEPBAR)
        waits = []
        for o in off:
            if lo <= o <= hi and "TRYWAIT" in sass[o][0]:
                br = next(x for x in off if x > o and "BRA" in sass[x][0])
                waits.append((o, smp(o) + smp(br)))
        res[f"{r}_waits"] = waits
        res[f"{r}_depbar"] = [(o, smp(o)) for o in off if lo <= o <= hi and "WARPGROUP.DEPBAR" in sass[o][0]]
    res["sb5_waits"] = [(o, sass[o][0]) for o in body if sass[o][4] >> 5 & 1]
    res["sb5_sets"] = [(o, sass[o][0]) for o in body if sass[o][2] == 5]
    return res


def main(argv=None) -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("export", help="ncu source export (sass.csv) of case sparse_v41 at git cc34511 (tuned V4.1)")
    args = ap.parse_args(argv)
    from deepkernels.mla import _gluon_sparse_decode_ws3 as W3
    rows = load_export(args.export)
    labels = {}
    sass = sass_hex(W3.compile_sm90_ws3("v41", 6, False, False, **KNOBS).asm["cubin"], labels)
    mine = [_norm2(t) for _, (t, *_) in sorted(sass.items())]
    theirs = [_norm2(r["txt"].rstrip(";")) for r in rows]
    bad = sum(a != b for a, b in zip(mine, theirs)) + abs(len(mine) - len(theirs))
    print(f"SASS: {len(mine)} local / {len(theirs)} profiled instructions, {bad} differ")
    if bad:
        print("the local build is not the profiled one")
        return 1
    res = analyse(sass, labels, rows)
    per = ELAPSED / BLOCKS
    print(f"{sum(r['samples'] for r in rows)} samples; {per:.0f} elapsed cycles per mean block")
    print("partitions:", [(hex(a), hex(b), r) for a, b, r in res["bounds"]], "samples", res["tot"])
    tp = res["tot"]["prod"]
    print(f"producer loop {res['n_prod_loop']} instructions {[hex(x) for x in res['loops']['prod']]}; "
          f"drain at {[hex(o) for o in res['drain']]}, empty try-wait {res['tw']:#x}")
    for k, s in res["prod_cat"].items():
        print(f"  {k:55s} {s:6d}  {100 * s / tp:5.1f} %  {s / tp * per:6.0f} cyc/blk")
    for r in ("soft", "pv"):
        n, s = res[f"{r}_loop"]
        print(f"{r} loop {n} instructions, {s} of {res['tot'][r]} samples ({s / res['tot'][r] * per:.0f} cyc/blk)")
        tr = res["tot"][r]
        print("   try-waits (+ their branch):", [(hex(o), x, round(x / tr * per)) for o, x in res[f"{r}_waits"]],
              " wgmma waits:", [(hex(o), x, round(x / tr * per)) for o, x in res[f"{r}_depbar"]], "(samples, cyc/blk)")
    print("try-wait retry loops (role, entries = block-waits whose first try failed, retries each):")
    for o, (r, tgt, ent, ret) in sorted(res["retry"].items()):
        print(f"  {o:#x} -> {tgt:#x} {r:5s} entries {ent:6d}, {ret / max(ent, 1):5.1f} retries each")
    print("producer loop SB5 waits:", [(hex(o), t) for o, t in res["sb5_waits"]])
    print("producer loop SB5 loads:", [(hex(o), t) for o, t in res["sb5_sets"]])
    return 0


if __name__ == "__main__":
    sys.exit(main())
