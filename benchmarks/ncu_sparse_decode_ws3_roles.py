"""Per-role cycles per (CTA, 64-token block) of the dispatched WS3 sparse decode kernel, V4.1, from an ncu source
export (benchmarks/notes/mla_sparse_gluon.md "Session 20 attribution (V4.1)"; method of notes/profiling.md "WS3 sparse
decode after IDX_AHEAD").

Cross-compiles the kernel for sm90 on the CPU as the profiled launch specialised it (``compile_sm90_ws3("v41", 6,
has_len=False, has_sink=False)``: every pointer / stride 16-divisible, num_warps 4, maxnreg 168), disassembles it
(``nvdisasm -c -hex``), checks that it matches the profiled SASS line for line (up to branch-target spelling and
``.reuse`` flags), then sums the stall samples of address ranges and prints the try-wait retry statistics and every
scoreboard-5 wait of the producer loop (control bits decoded from the hex). The ranges are those of git f4b6ff9's
build (Triton 3.6.0): another build moves them, so the script refuses to run when the SASS does not match.
``--ring``: also cross-compiles session 19's index-ring build (git 12dc192, ``idx_smem=True``; needs git) and lists
its producer loop's scoreboard-5 waits. Usage (CPU, any machine with the Triton wheel):

    PYTHONPATH=src python benchmarks/ncu_sparse_decode_ws3_roles.py \\
        benchmarks/results/ncu-h200-2026-11-30-s20/sparse_v41.sass.csv [--ring]
"""
from __future__ import annotations

import argparse
import csv
import os
import re
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "src"))

ELAPSED, BLOCKS = 314021, 62.06      # the export's elapsed cycles; mean 64-token blocks per CTA (66 parts, b 128)
# (role, item, [(lo, hi), ...]) in f4b6ff9's SASS (hi exclusive); retry loops (after the EXIT) with their partition
ITEMS = [
    ("prod", "dequant, raw loads, vmask, arrives, rest", [(0x5140, 0x5180), (0x51b0, 0x6770), (0x68d0, 0x7d10),
                                                          (0x7e20, 0x7f70)]),
    ("prod", "2 push rounds (MEMBAR, fence, BAR 0x3, elect, bulk copy)", [(0x6770, 0x68d0), (0x7d10, 0x7e20)]),
    ("prod", "loop-top drain of SB5 (0x4ea0)", [(0x4ea0, 0x4eb0)]),
    ("prod", "index / rows / prefetch address before the empty wait", [(0x4e90, 0x4ea0), (0x4eb0, 0x5130)]),
    ("prod", "S2R %tid.x in the loop", [(0x5180, 0x51a0)]),
    ("prod", "wait empty (try-wait, branch, retry)", [(0x5130, 0x5140), (0x51a0, 0x51b0), (0xeeb0, 0xeee0)]),
    ("prod", "per request / once before the loop", [(0x3ab0, 0x4e90)]),
    ("prod", "per request after the loop", [(0x7f70, 0x7fa0)]),
    ("prod", "exit (cluster barrier) + once", [(0x7fa0, 0x80e0)]),
    ("soft", "S = QK^T issue .. DEPBAR (+ fence)", [(0xa300, 0xa970), (0xa980, 0xaa20), (0xaa30, 0xaa80),
                                                    (0xaa90, 0xab30)]),
    ("soft", "vmask LDS -> PRMT", [(0xa970, 0xa980), (0xaa20, 0xaa30), (0xaa80, 0xaa90)]),
    ("soft", "softmax math", [(0xab30, 0xba10), (0xba20, 0xba30)]),
    ("soft", "P / alpha store, fence, BAR, pready", [(0xba40, 0xc060)]),
    ("soft", "P.V left (rescale, HGMMA, DEPBAR)", [(0xc060, 0xc5d0)]),
    ("soft", "arrives (empty local + remote), branch", [(0xc5d0, 0xc610)]),
    ("soft", "loop top", [(0xa230, 0xa2e0)]),
    ("soft", "wait ready", [(0xa2e0, 0xa300), (0xeee0, 0xef10)]),
    ("soft", "wait pfree", [(0xba10, 0xba20), (0xba30, 0xba40), (0xef10, 0xef40)]),
    ("soft", "per request: Q load + acc init", [(0x8960, 0xa230)]),
    ("soft", "per request: epilogue", [(0xc610, 0xec50), (0xef40, 0xef70)]),
    ("soft", "once (start-up, exit)", [(0x80e0, 0x8960), (0xec50, 0xee20)]),
    ("pv", "wait pready", [(0x1490, 0x14b0), (0xee50, 0xee80)]),
    ("pv", "P.V right HGMMA + DEPBAR", [(0x1de0, 0x1ea0)]),
    ("pv", "wait ready", [(0x1430, 0x1450), (0xee20, 0xee50)]),
    ("pv", "fence + O rescale (alpha LDS, FMULs)", [(0x14b0, 0x1de0)]),
    ("pv", "arrives (pfree, empty, remote), branch", [(0x1ea0, 0x1f50)]),
    ("pv", "loop top", [(0x13b0, 0x1430), (0x1450, 0x1490)]),
    ("pv", "per request (epilogue)", [(0x1f50, 0x3930), (0xee80, 0xeeb0)]),
    ("pv", "once", [(0x170, 0x13b0), (0x3930, 0x3ab0)]),
]
ROLES = {"prod": "producer (warps 8-11)", "soft": "softmax WG (default, warps 0-3)", "pv": "PV WG (warps 4-7)"}
# try-wait retry loops: (name, loop branch, branch back): retries = executions of the loop branch, entries = of the
# branch back (block-waits whose first try failed)
RETRY = [("PV ready", 0xee30, 0xee40), ("PV pready", 0xee60, 0xee70), ("producer empty", 0xeec0, 0xeed0),
         ("softmax ready", 0xeef0, 0xef00)]
PROD_LOOP = (0x4e90, 0x7f70)


def load_export(path):
    rows = list(csv.reader(open(path)))
    hdr, data = rows[1], rows[2:]
    col = {h: i for i, h in enumerate(hdr)}
    base = int(data[0][col["Address"]], 16)
    out = []
    for r in data:
        out.append(dict(off=int(r[col["Address"]], 16) - base, txt=re.sub(r"\s+", " ", r[col["Source"]].strip()),
                        samples=int(r[col["Warp Stall Sampling (All Samples)"]] or 0),
                        exe=int(r[col["Instructions Executed"]] or 0)))
    return out


def sass_hex(cubin: bytes, labels: dict | None = None) -> dict:
    """offset -> (text, stall, write SB, read SB, wait mask) from ``nvdisasm -c -hex`` (control bits in the upper 23
    bits of the second 64-bit word); ``labels`` (if given) receives label -> offset."""
    from deepkernels.testing.compile import nvidia_tool
    with tempfile.NamedTemporaryFile(suffix=".cubin", delete=False) as f:
        f.write(cubin)
    try:
        txt = subprocess.run([nvidia_tool("nvdisasm"), "-c", "-hex", f.name], capture_output=True, text=True,
                             check=True).stdout
    finally:
        os.unlink(f.name)
    lines, out, pending = txt.splitlines(), {}, []
    for i, ln in enumerate(lines):
        lm = re.match(r"^(\.L_x_\d+):", ln)
        if lm:
            pending.append(lm.group(1))
        m = re.match(r"\s+/\*([0-9a-f]{4,})\*/\s+(.*?);\s+/\* 0x[0-9a-f]+ \*/", ln)
        if m and i + 1 < len(lines):
            hi = int(re.search(r"/\* (0x[0-9a-f]+) \*/", lines[i + 1]).group(1), 16) >> 41
            if labels is not None:
                labels.update({p: int(m.group(1), 16) for p in pending})
            pending = []
            out[int(m.group(1), 16)] = (re.sub(r"\s+", " ", m.group(2)).strip(), hi & 15, (hi >> 5) & 7, (hi >> 8) & 7,
                                        (hi >> 11) & 0x3F)
    return out


def _norm(t: str) -> str:
    return re.sub(r"0x[0-9a-f]+", "X", re.sub(r"`\(\.L_x_\d+\)", "X", t.replace(".reuse", "")))


def sb5_waits(sass: dict, lo: int, hi: int):
    """The instructions in [lo, hi) whose wait mask includes scoreboard 5, and those that set it (loads)."""
    waits = [(o, t, m) for o, (t, _, _, _, m) in sorted(sass.items()) if lo <= o < hi and m >> 5 & 1]
    sets = [(o, t) for o, (t, _, w, _, _) in sorted(sass.items()) if lo <= o < hi and w == 5]
    return waits, sets


def main(argv=None) -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("export", help="ncu source export (sass.csv) of case sparse_v41 at git f4b6ff9")
    ap.add_argument("--ring", action="store_true", help="also the index-ring build of git 12dc192 (needs git)")
    args = ap.parse_args(argv)
    from deepkernels.mla import _gluon_sparse_decode_ws3 as W3
    rows = load_export(args.export)
    sass = sass_hex(W3.compile_sm90_ws3("v41", 6, False, False).asm["cubin"])
    mine = [_norm(t) for _, (t, *_) in sorted(sass.items())]
    theirs = [_norm(r["txt"].rstrip(";")) for r in rows]
    bad = sum(a != b for a, b in zip(mine, theirs)) + abs(len(mine) - len(theirs))
    print(f"SASS: {len(mine)} local / {len(theirs)} profiled instructions, {bad} differ")
    if bad:
        print("the local build is not the profiled one: the address ranges do not apply")
        return 1
    by_off = {r["off"]: r for r in rows}
    covered = set()
    tot = {k: 0 for k in ROLES}
    for r in rows:
        o = r["off"]
        role = ("pv" if 0x170 <= o < 0x3ab0 or 0xee20 <= o < 0xeeb0 else
                "prod" if 0x3ab0 <= o < 0x80e0 or 0xeeb0 <= o < 0xeee0 else
                "soft" if 0x80e0 <= o < 0xef70 else None)
        if role:
            tot[role] += r["samples"]
    per = ELAPSED / BLOCKS
    print(f"{sum(r['samples'] for r in rows)} samples; {per:.0f} elapsed cycles per mean block "
          f"({ELAPSED} / {BLOCKS})")
    for role, name in ROLES.items():
        print(f"\n{name}: {tot[role]} samples")
        for rl, item, ranges in ITEMS:
            if rl != role:
                continue
            s = sum(r["samples"] for r in rows if any(lo <= r["off"] < hi for lo, hi in ranges))
            covered.update(r["off"] for r in rows if any(lo <= r["off"] < hi for lo, hi in ranges))
            print(f"  {item:58s} {s:6d}  {100 * s / tot[role]:5.1f} %  {s / tot[role] * per:6.0f} cyc/blk")
    left = sum(r["samples"] for r in rows if r["off"] not in covered and 0x170 <= r["off"] < 0xef70)
    print(f"\nsamples outside every item (partition bodies): {left}")
    print("try-wait retry loops (entries = block-waits whose first try failed):")
    for name, loop, back in RETRY:
        n_ret, n_ent = by_off[loop]["exe"], by_off[back]["exe"]
        print(f"  {name:16s} entries {n_ent:6d} of 32768 ({100 * n_ent / 32768:5.1f} %), "
              f"{n_ret / max(n_ent, 1):5.1f} retries each")
    waits, sets = sb5_waits(sass, *PROD_LOOP)
    print("producer loop: scoreboard-5 waits", [(hex(o), t, by_off[o]["samples"]) for o, t, _ in waits])
    print("               scoreboard-5 writers", [(hex(o), t) for o, t in sets])
    if args.ring:
        with tempfile.TemporaryDirectory() as tmp:
            subprocess.run(f"git archive 12dc192 src | tar -x -C {tmp}", shell=True, check=True,
                           cwd=os.path.join(HERE, ".."))
            code = ("import sys; from deepkernels.mla import _gluon_sparse_decode_ws3 as W; "
                    "sys.stdout.buffer.write(W.compile_sm90_ws3('v41', 6, False, False, idx_smem=True)"
                    ".asm['cubin'])")
            cubin = subprocess.run([sys.executable, "-c", code], capture_output=True, check=True,
                                   env=dict(os.environ, PYTHONPATH=os.path.join(tmp, "src"))).stdout
        labels = {}
        ring = sass_hex(cubin, labels)
        # the producer block loop: the backward branch whose loop holds the 8 chunk LDG.E.128 and no HGMMA
        for o, (t, *_) in sorted(ring.items()):
            m = re.search(r"BRA `\((\.L_x_\d+)\)", t)
            lo = labels.get(m.group(1), o) if m else o
            body = [ring[x][0] for x in ring if lo <= x <= o]
            if lo < o and sum("LDG.E.128" in b for b in body) == 8 and not any("HGMMA" in b for b in body):
                waits, _ = sb5_waits(ring, lo, o + 16)
                print(f"index-ring build (12dc192): producer loop {lo:#x}-{o:#x}, scoreboard-5 waits:",
                      [(hex(x), t, f"mask {msk:06b}") for x, t, msk in waits])
    return 0


if __name__ == "__main__":
    sys.exit(main())
