"""Markdown summary of a `deepkernels bench --json` file (the README results table).

    python -m deepkernels.bench.report benchmarks/results/h200-<date>.json
"""
from __future__ import annotations

import json
import sys

__all__ = ["markdown_table", "main"]


def markdown_table(result: dict) -> str:
    """One line per op/shape: our time (graph replay and whole call), TFLOPS, GB/s, the anchor and the ratio."""
    p = result["provenance"]
    if p.get("gpu"):
        head = (f"Measured {p['date']} on {p['gpu']} (driver {p.get('driver')}, torch {p['torch']}, "
                f"triton {p['triton']}, deepkernels {p['git_sha']}); `deepkernels bench` (median of "
                "`triton.testing.do_bench`, L2 flushed; TFLOPS/GB/s/ratio from CUDA-graph replay, whole call beside it).")
    else:
        head = (f"Checked {p['date']} without a GPU (torch {p['torch']}, triton {p['triton']}, deepkernels "
                f"{p['git_sha']}): correctness only, through the reference and Triton's interpreter; no timings.")
    lines = [head,
             "",
             "| suite | op / shape | check | µs (graph / call) | TFLOPS | GB/s | anchor | anchor µs (graph) | ours vs anchor | target |",
             "|---|---|---|---|---|---|---|---|---|---|"]
    rows = result["rows"]
    for i, r in enumerate(rows):
        if r["provider_kind"] != "ours":
            continue
        anchors = [a for a in rows[i + 1:i + 4] if a["provider_kind"] == "anchor" and a["name"] == r["name"]]
        a = anchors[0] if anchors else None
        status = r["status"] if r["status"] != "PASS" else f"PASS ({r['metric']})"
        if not r.get("us"):
            lines.append(f"| {r['suite']} | {r['name']} | {status} | | | | | | | {r['target']} |")
            continue
        g = r.get("graph_us")
        t = f"{g:.1f} / {r['us']:.1f}" if g else f"— / {r['us']:.1f}"
        if a is None:
            an, at, ratio = "", "", ""
        elif a["status"] != "ok":
            an, at, ratio = a["provider"], "refused", ""
        else:
            an = a["provider"]
            at = f"{a.get('graph_us') or a['us']:.1f}"
            ratio = f"{r['ratio_vs'][a['provider']]:.2f}x" if a["provider"] in r.get("ratio_vs", {}) else ""
        lines.append(f"| {r['suite']} | {r['name']} | {status} | {t} | {r['tflops']:.0f} | {r['gbps']:.0f} | {an} | "
                     f"{at} | {ratio} | {r['target']} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    """``python -m deepkernels.bench.report PATH``: print the table of a ``deepkernels bench --json`` file. A missing
    argument, an unreadable file or one that is not such a JSON file is a usage error (exit 2, one line naming the
    path), not a traceback."""
    import argparse
    parser = argparse.ArgumentParser(prog="python -m deepkernels.bench.report",
                                     description="Markdown table of a `deepkernels bench --json` file.")
    parser.add_argument("path", metavar="PATH", help="JSON written by `deepkernels bench --json PATH`")
    args = parser.parse_args(argv)
    try:
        with open(args.path) as f:
            result = json.load(f)
    except OSError as e:
        parser.error(f"cannot read {args.path}: {e.strerror or e}")
    except json.JSONDecodeError as e:
        parser.error(f"{args.path} is not JSON ({e})")
    if not isinstance(result, dict) or "provenance" not in result or "rows" not in result:
        parser.error(f"{args.path} is not a `deepkernels bench --json` file (no 'provenance' / 'rows')")
    print(markdown_table(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
