"""Per-role cycles per tile of the dispatched PVR build of the dense decode Gluon kernel (session 20b; the table in
benchmarks/notes/mla_decode_gluon.md "Session 20 attribution of PVR"), from the ncu source export
``results/ncu-h200-2026-11-30-s20b/dense_decode.sass.csv`` (git cc34511, h_q 128 s_q 1 s_k 8K, b 128). Method of
``benchmarks/mla_decode_pvr_attribution.py`` (its ``load``): SASS address -> partition (PV WG, producer, padding warps,
softmax WG; the out-of-line try-wait retry loops to the partition and barrier they return to) and in-loop item by
hand-read address markers of this build; cycles per tile = item samples / role samples x elapsed cycles / tiles per
CTA. ``--check-sass`` cross-compiles the profiled variant (Q by TMA + TRIM + PVR, non-causal, bf16; needs the
bundled ptxas) and compares it with the export instruction by instruction.

Usage: ``PYTHONPATH=src python benchmarks/mla_decode_s20b_attribution.py [--check-sass]`` (CPU).
"""
from __future__ import annotations

import argparse
import os
import re
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
PATH = "results/ncu-h200-2026-11-30-s20b/dense_decode.sass.csv"
CYCLES, TILES = 829015, 248.24
PART = dict(pv=(0x180, 0x6350), prod=(0x6350, 0x80b0), pad=(0x80b0, 0x81d0), smx=(0x81d0, 0x11520))
RETRY = {0x11520: ("pv", "wait kready_b"), 0x11550: ("pv", "wait pready"), 0x11580: ("pv", "wait sissued"),
         0x115b0: ("pv", "per request + once"), 0x115e0: ("prod", "per request + once"),
         0x11610: ("prod", "wait kempty (a)"), 0x11640: ("prod", "wait kempty_b"),
         0x11670: ("smx", "per request + once"), 0x116a0: ("smx", "wait kready (a)"),
         0x116d0: ("smx", "wait kready_b"), 0x11700: ("smx", "wait pfree"), 0x11730: ("smx", "per request + once")}
# softmax loop 0x9ed0..0xe960, PV loop 0x17d0..0x4960, producer loop 0x75f0..0x7ff0 (back-branch targets)
SMX = [(0x9f80, "loop top"), (0x9fb0, "wait kready (a)"), (0xa3d0, "S NoPE 0-255 issue"), (0xa3f0, "wait kready_b"),
       (0xa960, "S NoPE 256-511 issue"), (0xa9a0, "S RoPE issue"), (0xa9d0, "BAR + sissued arrive"),
       (0xa9e0, "S DEPBAR"), (0xb8e0, "softmax math"), (0xb900, "wait pfree"), (0xe860, "hand-off"),
       (0xe940, "P.V_L issue..DEPBAR"), (0xe970, "kempty arrive + loop end")]
PV = [(0x1870, "loop top"), (0x1890, "wait kready_b"), (0x18b0, "wait pready"), (0x46e0, "alpha LDS + O_R rescale"),
      (0x4700, "wait sissued"), (0x4920, "P.V_R issue..DEPBAR"), (0x4970, "pfree / kempty_b arrives")]


def _acc_reg(src):
    m = re.match(r"FMUL R(\d+),", src)
    return m is not None and int(m.group(1)) < 152          # the O accumulators live in R24..R151


def classify(off, src, ex):
    for role, (a, b) in PART.items():
        if a <= off < b:
            break
    else:
        return RETRY.get(off - (off - 0x11520) % 0x30, ("other", "tail"))
    if role in ("smx", "pv"):
        lo, hi, marks = (0x9ed0, 0xe960, SMX) if role == "smx" else (0x17d0, 0x4960, PV)
        if not lo <= off <= hi:
            return role, "per request + once"
        if ex == 0:
            return role, "(skipped code)"
        item = next(name for end, name in marks if off < end)
        if item == "hand-off":
            item = "O_L rescale (128 FMUL)" if _acc_reg(src) else "P STSM, fence, BAR, pready"
        return role, item
    if role == "prod":
        if not 0x75f0 <= off <= 0x7ff0:
            return role, "per request + once"
        if 0x7670 <= off <= 0x7690:
            return role, "wait kempty (a)"
        if 0x7c00 <= off <= 0x7c10:
            return role, "wait kempty_b"
        return role, "9 x UTMALDG" if "UTMALDG" in src else "page LDG, descriptors, expect, loop"
    return role, "all"


def attribute():
    from mla_decode_pvr_attribution import load, tabulate
    prof = load(os.path.join(HERE, PATH))
    tabulate("s20b (PVR)", prof, classify, CYCLES / TILES)
    return prof


def check_sass(prof):
    """mla_decode_pvr_attribution.check_sass on the PVR build (the one this export profiled)."""
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    import mla_decode_pvr_attribution as A
    return A.check_sass(prof, pvr=True)


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--check-sass", action="store_true")
    a = p.parse_args(argv)
    prof = attribute()
    return 0 if not a.check_sass or check_sass(prof) else 1


if __name__ == "__main__":
    sys.exit(main())
