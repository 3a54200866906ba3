"""Per-role cycles per tile of the dense decode Gluon kernel from an ncu source export (session 20, the table in
benchmarks/notes/mla_decode_gluon.md "Session 20 attribution"; method of benchmarks/notes/profiling.md "Dense decode
Gluon kernel, h_q 128 s_k 8K (session 19)").

Reads ``results/ncu-h200-2026-11-30-s{19,20}/dense_decode.sass.csv`` (per-instruction warp-stall samples and
execution counts), assigns every SASS address to a partition (PV WG, producer, padding warps, softmax WG; the
out-of-line try-wait retry loops to the partition and barrier they return to) and every in-loop instruction to an
item by address (hand-read markers of each build: :data:`LAYOUTS`), then prints cycles per tile = item samples /
role samples x (elapsed cycles / tiles per CTA). ``--check-sass`` (s20 only, needs the bundled ptxas) cross-compiles
the profiled variant (Q by TMA + TRIM, non-causal, bf16) and compares it with the export instruction by instruction
(opcode and operands up to ``.reuse`` and branch-target notation).

Usage: ``PYTHONPATH=src python benchmarks/mla_decode_pvr_attribution.py [s19|s20] [--check-sass]`` (CPU).
"""
from __future__ import annotations

import argparse
import collections
import csv
import os
import re
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
# per build: elapsed cycles, tiles per CTA, partition ranges, retry loops (address -> role, barrier), item markers
LAYOUTS = {
    "s20": dict(
        path="results/ncu-h200-2026-11-30-s20/dense_decode.sass.csv", cycles=841602, tiles=248.24,
        part=dict(pv=(0x180, 0x6320), prod=(0x6320, 0x8080), pad=(0x8080, 0x81a0), smx=(0x81a0, 0x11130)),
        retry={0x11130: ("pv", "kready"), 0x11160: ("pv", "pready"), 0x11190: ("pv", "pready_end"),
               0x111c0: ("prod", "qempty"), 0x111f0: ("prod", "kempty"), 0x11220: ("smx", "qready"),
               0x11250: ("smx", "kready"), 0x11280: ("smx", "pfree"), 0x112b0: ("smx", "pfree_end")},
        sm=dict(kready=(0x9d50, 0x9d70), s_rope=0xa590, s_dep=0xa5e0, pfree=(0xb4d0, 0xb510), stsm=0xb520,
                pvl_arrive=0xe430, pvl_dep=0xe550, top=0x9ca0, end=0xe560),
        pv=dict(kready=(0x1870, 0x1880), pready=(0x1890, 0x18a0), hg=0x46e0, dep=0x48d0, top=0x17d0),
        pr=dict(kempty=(0x7650, 0x7670))),
    "s19": dict(
        path="results/ncu-h200-2026-11-30-s19/dense_decode.sass.csv", cycles=865659, tiles=248.24,
        part=dict(pv=(0x180, 0x6260), prod=(0x6260, 0x80a0), pad=(0x80a0, 0x81c0), smx=(0x81c0, 0x11230)),
        retry={0x11230: ("pv", "kready"), 0x11260: ("pv", "pready"), 0x11290: ("pv", "pready_end"),
               0x112c0: ("prod", "qempty"), 0x112f0: ("prod", "kempty"), 0x11320: ("smx", "qready"),
               0x11350: ("smx", "kready"), 0x11380: ("smx", "pfree"), 0x113b0: ("smx", "pfree_end")},
        sm=dict(kready=(0x9d80, 0x9da0), s_rope=0xa5f0, s_dep=0xa640, pfree=(0xb560, ), stsm=0xb6d0,
                pvl_arrive=0xe5e0, pvl_dep=0xe700, top=0x9cd0, end=0xe710),
        pv=dict(kready=(0x17e0, 0x17f0), pready=(0x1800, 0x1810), hg=0x4650, dep=0x4830, top=0x17d0),
        pr=dict(kempty=(0x76a0, 0x76b0))),
}
TILE_EXEC, PROD_EXEC = 131072, 32768          # per-tile execution counts (4 warps / 1 warp x 32,768 CTA-tiles)


def load(path):
    rows = list(csv.reader(open(path)))
    hdr, data = rows[1], rows[2:]
    ia, isrc = hdr.index("Address"), hdr.index("Source")
    isamp, iex = hdr.index("Warp Stall Sampling (All Samples)"), hdr.index("Instructions Executed")
    base = int(data[0][ia], 16)
    return [(int(r[ia], 16) - base, r[isrc].strip(), int(r[isamp] or 0), int(r[iex] or 0)) for r in data]


def _acc_reg(src):
    m = re.match(r"FMUL R(\d+),", src)
    return m is not None and int(m.group(1)) < 152          # the O accumulators live in R24..R151


def classify(lay, off, src, ex):
    for role, (a, b) in lay["part"].items():
        if a <= off < b:
            break
    else:
        base = off - (off - min(lay["retry"])) % 0x30
        if base in lay["retry"]:
            role, bar = lay["retry"][base]
            return role, "wait " + bar
        return "other", "tail"
    if role == "smx":
        sm = lay["sm"]
        if ex != TILE_EXEC and not (sm["top"] <= off <= sm["end"] and ex == 0):
            return role, "per request + once"
        if off < sm["kready"][0] or off > sm["end"] + 0x30:
            return role, "loop top + end"
        if off <= sm["kready"][1]:
            return role, "wait kready"
        if off < sm["s_rope"]:
            return role, "S NoPE issue"
        if off < sm["s_dep"]:
            return role, "S RoPE issue"
        if off == sm["s_dep"]:
            return role, "S DEPBAR"
        if off in sm["pfree"]:
            return role, "wait pfree"
        if off < sm["stsm"]:
            return role, "softmax math"
        if off < sm["pvl_arrive"]:
            return role, "O_L rescale (128 FMUL)" if _acc_reg(src) else "P STSM, fence, BAR, pready"
        if off <= sm["pvl_dep"]:
            return role, "P.V_L issue..DEPBAR"
        return role, "loop top + end"
    if role == "pv":
        pv = lay["pv"]
        if ex != TILE_EXEC and not (pv["top"] <= off <= pv["dep"] + 0x80 and ex == 0):
            return role, "per request + once"
        if off in pv["kready"]:
            return role, "wait kready"
        if off in pv["pready"]:
            return role, "wait pready"
        if off < pv["kready"][0] or off > pv["dep"]:
            return role, "loop top / arrives"
        if off < pv["hg"]:
            return role, "alpha LDS + O_R rescale"
        return role, "P.V_R issue..DEPBAR"
    if role == "prod":
        if ex != PROD_EXEC:
            return role, "per request + once"
        if off in lay["pr"]["kempty"]:
            return role, "wait kempty"
        return role, "9 x UTMALDG" if "UTMALDG" in src else "page LDG, descriptors, expect, loop"
    return role, "all"


def tabulate(label, prof, classify_one, cpt):
    """Per role (softmax WG / PV WG / producer / padding warps) and item: stall samples -> cycles per tile (the item's
    share of its role's samples x ``cpt``); ``classify_one(off, src, ex)`` -> (role, item). Prints the table."""
    items = collections.defaultdict(collections.Counter)
    for off, src, s, ex in prof:
        role, item = classify_one(off, src, ex)
        items[role][item] += s
    print(f"{label}: {sum(s for _, _, s, _ in prof)} samples, {cpt:.0f} cycles per tile")
    for role in ("smx", "pv", "prod", "pad"):
        tot = sum(items[role].values())
        print(f"  {role}: {tot} samples")
        for item, s in sorted(items[role].items(), key=lambda kv: -kv[1]):
            print(f"    {item:40s} {s / tot * cpt:7.0f}")


def attribute(name):
    lay = LAYOUTS[name]
    prof = load(os.path.join(HERE, lay["path"]))
    tabulate(name, prof, lambda off, src, ex: classify(lay, off, src, ex), lay["cycles"] / lay["tiles"])
    return prof


def check_sass(prof, pvr=False):
    """The local cross-compile of the profiled build (q_tma + trim, non-causal bf16; ``pvr``: the PVR build) against
    the ncu export ``prof``, instruction by instruction (branch targets, ``.reuse`` and spacing normalised)."""
    from deepkernels.mla import _gluon_dense_decode as G
    from deepkernels.testing.compile import ptxas_sm90
    rep = ptxas_sm90(G._compile_sm90(None, False, "bf16", False, True, True, pvr=pvr).asm["ptx"], sass=True)
    loc = [(int(m.group(1), 16), m.group(2)) for line in rep.sass.splitlines()
           if (m := re.match(r"\s*/\*([0-9a-f]{4,})\*/\s+(.*?)\s*;", line))]

    def norm(t):
        t = re.sub(r"\(\*.*\*\)", "", t.replace(".reuse", ""))
        return re.sub(r"\s+", " ", re.sub(r"(BRA|BRX|CALL\S*|BSSY\S*)\s.*", r"\1 T", t)).strip().replace(" ,", ",")

    diff = [(hex(a), x, y) for (a, x), (b, y, _, _) in zip(loc, prof) if a != b or norm(x) != norm(y)]
    print(f"local cross-compile {len(loc)} instructions, export {len(prof)}; differing {len(diff)}", diff[:3])
    return len(loc) == len(prof) and not diff


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("build", nargs="?", default="s20", choices=sorted(LAYOUTS))
    p.add_argument("--check-sass", action="store_true")
    a = p.parse_args(argv)
    prof = attribute(a.build)
    if a.check_sass and a.build == "s20":
        return 0 if check_sass(prof) else 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
