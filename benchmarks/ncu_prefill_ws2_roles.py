"""Per-role cycles per (CTA, block) of the dispatched WS2 sparse prefill kernel from an ncu source export
(benchmarks/notes/mla_prefill.md "Session 20 attribution"; method of notes/profiling.md "Sparse prefill WS2 with the
4-rows gather (session 19)").

Cross-compiles the kernel for sm90 on the CPU exactly as the profiled launch specialised it (GATHER_ROWS4, Q_ASYNC,
O_STAGE on; every non-float argument 16-divisible; num_warps 4, maxnreg 168), disassembles it, checks that it matches
the profiled SASS line for line (up to LDGSTS operand order / branch-target spelling), then sums the stall samples of
address ranges. The ranges are those of git f4b6ff9's build (Triton 3.6.0): another build moves them, so the script
refuses to run when the SASS does not match. Usage (CPU, any machine with the Triton wheel):

    PYTHONPATH=src python benchmarks/ncu_prefill_ws2_roles.py \\
        benchmarks/results/ncu-h200-2026-11-30-s20/prefill8k_ws2.sass.csv --sm-active 1809202.81
"""
from __future__ import annotations

import argparse
import csv
import glob
import os
import re
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "src"))

# (role, item, [(lo, hi), ...]) in f4b6ff9's SASS; the partition of an item is its role
ITEMS = [
    ("smx", "loop top + 8 index LDG", [(0x6030, 0x6310)]),
    ("smx", "wait ready", [(0x6310, 0x6370), (0xa870, 0xa8a0)]),
    ("smx", "fence -> WARPGROUP.ARRIVE", [(0x6370, 0x64e0)]),
    ("smx", "S NoPE issue", [(0x64e0, 0x6c80)]),
    ("smx", "S RoPE issue", [(0x6c80, 0x6cd0)]),
    ("smx", "S DEPBAR", [(0x6cd0, 0x6ce0)]),
    ("smx", "mask + row max", [(0x6ce0, 0x77a0)]),
    ("smx", "exp2 + sums (+ pfree wait)", [(0x77a0, 0x7c10), (0xa8a0, 0xa8d0)]),
    ("smx", "P / alpha store + fence + BAR + pready", [(0x7c10, 0x8260)]),
    ("smx", "O[:, :256] rescale", [(0x8260, 0x8730)]),
    ("smx", "P.V left issue", [(0x8730, 0x87b0)]),
    ("smx", "P.V left DEPBAR", [(0x87b0, 0x87c0)]),
    ("smx", "BAR + empty arrive + branch", [(0x87c0, 0x87f0)]),
    ("smx", "setup (pre-loop)", [(0x42c0, 0x6030)]),
    ("smx", "  of which the Q phase", [(0x4730, 0x4e20)]),
    ("smx", "epilogue", [(0x87f0, 0xa7b0), (0xa8d0, 0xa910)]),
    ("pv", "loop top BAR", [(0xbc0, 0xc30)]),
    ("pv", "wait ready", [(0xc30, 0xc50)]),
    ("pv", "wait pready", [(0xc50, 0xc70), (0xa7e0, 0xa810)]),
    ("pv", "fence, alpha, descriptors", [(0xc70, 0xdb0)]),
    ("pv", "O[:, 256:] rescale", [(0xdb0, 0x15d0)]),
    ("pv", "P.V right issue", [(0x15d0, 0x1690)]),
    ("pv", "P.V right DEPBAR", [(0x1690, 0x16a0)]),
    ("pv", "arrives pfree, empty", [(0x16a0, 0x16f0)]),
    ("pv", "setup", [(0x220, 0xbc0)]),
    ("pv", "epilogue", [(0x16f0, 0x31b0), (0xa810, 0xa840)]),
    ("prod", "loop top", [(0x3570, 0x3630)]),
    ("prod", "wait empty", [(0x3630, 0x3670), (0xa840, 0xa870)]),
    ("prod", "index LDG issue", [(0x3670, 0x3850)]),
    ("prod", "first index use", [(0x3850, 0x3860)]),
    ("prod", "addresses + LDGSTS + later uses", [(0x3860, 0x4190)]),
    ("prod", "ready arrives + branch", [(0x4190, 0x4260)]),
    ("prod", "setup", [(0x3230, 0x3570)]),
    ("prod", "exit-barrier wait", [(0x4260, 0x42c0)]),
]
# partition ranges (+ a third of the all-warps entry 0x0-0x220 each; the worker tail 0x31b0-0x3230 split PV / producer)
PARTS = {"smx": [(0x42c0, 0xa910)], "pv": [(0x220, 0x31b0)], "prod": [(0x3230, 0x42c0)]}


def local_sass():
    from deepkernels._gluon import compile_sm90
    from deepkernels.mla import _gluon_sparse_prefill as gsp, _gluon_sparse_prefill_ws2 as w2
    consts = dict(zip(w2._CONSTEXPRS, (64, False, False, w2.WS2_PRODUCER_REGS, w2.WS2_PV_REGS, True, True, True)))
    div = [k for k, v in gsp.SIG.items() if v != "fp32"]
    k = compile_sm90(w2._sparse_prefill_gluon_ws2_kernel, gsp.SIG, consts, div, num_warps=4, maxnreg=w2.WS2_MAXNREG)
    import triton
    nvd = glob.glob(os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin", "nvdisasm"))[0]
    with tempfile.TemporaryDirectory() as tmp:
        p = os.path.join(tmp, "k.cubin")
        with open(p, "wb") as f:
            f.write(k.asm["cubin"])
        out = subprocess.run([nvd, "-hex", p], capture_output=True, text=True, check=True).stdout
    ins = []
    for line in out.splitlines():
        m = re.match(r"\s*/\*([0-9a-f]{4,})\*/\s+(.*?)\s*;", line)
        if m:
            ins.append((int(m.group(1), 16), m.group(2)))
    return ins


def _norm(s):
    s = re.sub(r"\.reuse", "", s)
    s = re.sub(r"(BRA|BSSY)\b.*", r"\1", s)
    return re.sub(r"\s+", "", s).lower()


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("sass_csv", help="ncu --page source --csv export (SASS view)")
    ap.add_argument("--sm-active", type=float, required=True, help="SM Active Cycles (ncu details page)")
    ap.add_argument("--ctas", type=int, default=2048)
    ap.add_argument("--sms", type=int, default=132)
    ap.add_argument("--blocks", type=int, default=32, help="64-token blocks per CTA (topk / 64)")
    args = ap.parse_args(argv)
    rows = list(csv.reader(open(args.sass_csv)))
    hdr, data = rows[1], rows[2:]
    col = hdr.index("Warp Stall Sampling (All Samples)")
    loc = local_sass()
    bad = [hex(a) for (a, s), r in zip(loc, data) if _norm(s) != _norm(r[1].strip()) and "LDGSTS" not in s]
    if len(loc) != len(data) or bad:
        sys.exit(f"the local SASS does not match the profile ({len(loc)} vs {len(data)} lines, first differences "
                 f"{bad[:5]}): the address ranges would be wrong")
    n = {a: int(r[col] or 0) for (a, _), r in zip(loc, data)}

    def S(ranges):
        return sum(v for a, v in n.items() if any(lo <= a < hi for lo, hi in ranges))
    ent = S([(0, 0x220)]) / 3
    tail = S([(0x31b0, 0x3230)]) / 2
    part = {"smx": S(PARTS["smx"]) + ent, "pv": S(PARTS["pv"]) + ent + tail, "prod": S(PARTS["prod"]) + ent + tail}
    cpb = args.sm_active * args.sms / args.ctas / args.blocks
    print(f"cycles per (CTA, block) {cpb:.0f}; samples {sum(n.values())}; partitions "
          + ", ".join(f"{k} {v:.0f}" for k, v in part.items()))
    for role, name, ranges in ITEMS:
        s = S(ranges)
        print(f"{role:5s} {name:42s} {s:7d} samples {s / part[role] * cpb:7.0f} cycles/block")
    return 0


if __name__ == "__main__":
    sys.exit(main())
