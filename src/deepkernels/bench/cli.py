"""The `deepkernels` command line: `deepkernels bench`.

On a CUDA device every op runs on the docs/ANCHORS.md shapes: each row checks the result against a reference (a
wrong result is a FAIL row), then times ours and the in-run anchor. Without a GPU the same suites run at
small shapes through the real kernels in Triton's interpreter (correctness only), followed by the H200's
analytical roofline for the production shapes, labelled as such.
"""
from __future__ import annotations

import argparse
import json
import os
import sys

__all__ = ["main"]


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="deepkernels", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = p.add_subparsers(dest="command", required=True)
    b = sub.add_parser("bench", help="check and time every op against its reference and in-run anchor")
    b.add_argument("--quick", action="store_true", help="a few shapes per suite")
    b.add_argument("--only", choices=["gemm", "grouped", "mla", "sparse", "prefill"], help="one suite")
    b.add_argument("--json", metavar="PATH", help="write all rows with provenance to PATH")
    b.add_argument("--plot", metavar="PATH", help="write a roofline PNG of the measured rows (GPU runs)")
    b.add_argument("--cpu", action="store_true", help="run the CPU mode even when a GPU is present")
    from deepkernels.model.roofline import add_roofline_parser
    from deepkernels.rails.cli import add_rails_parser

    add_rails_parser(sub)
    add_roofline_parser(sub)
    return p


def _fmt(x, spec):
    return "" if x is None else format(x, spec)


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    parser = _parser()
    args = parser.parse_args(argv)
    if args.command == "bench":
        for opt in ("json", "plot"):
            path = getattr(args, opt)
            folder = os.path.dirname(os.path.abspath(path)) if path else None
            if folder and not os.path.isdir(folder):
                parser.error(f"--{opt} {path}: folder {folder} does not exist")
            if path and os.path.isdir(path):   # else open() fails after the first case has run
                example = os.path.join(path, "h200." + ("json" if opt == "json" else "png"))
                parser.error(f"--{opt} {path}: is a folder; give a file path (e.g. {example})")
    if args.command == "rails":
        return args._rails_func(args)
    if args.command == "roofline":
        from deepkernels.model.roofline import run_roofline

        try:
            return run_roofline(args)
        except ValueError as e:
            parser.error(f"roofline: {e}")

    import torch

    gpu = torch.cuda.is_available() and not args.cpu
    if not gpu and os.environ.get("TRITON_INTERPRET", "0") in ("", "0"):
        # The kernels must be decorated in interpreter mode, so the CPU mode re-runs itself with it on.
        env = dict(os.environ, TRITON_INTERPRET="1")
        os.execve(sys.executable, [sys.executable, "-m", "deepkernels.bench.cli", *argv], env)

    from rich.console import Console
    from rich.progress import Progress
    from rich.table import Table

    from .cases import build_cases
    from .runner import analytical_rows, provenance, run_case

    console = Console(width=max(Console().width, 150))
    device = "cuda" if gpu else "cpu"
    prov = provenance()
    mode = (f"GPU {prov.get('gpu')}: checked, then timed (median of triton.testing.do_bench)" if gpu else
            "no GPU: small shapes through the Triton interpreter, correctness only; no timings")
    console.print(f"[bold]deepkernels bench[/bold] — {mode}")
    cases = build_cases(device, small=not gpu, quick=args.quick, only=args.only)
    rows: list[dict] = []
    with Progress(console=console, transient=True) as progress:
        task = progress.add_task("running", total=len(cases))
        for case in cases:
            progress.update(task, description=case.name)
            rows += run_case(case, timed=gpu)
            progress.advance(task)
            if args.json:  # keep what has been measured if the run is cut short
                with open(args.json, "w") as f:
                    json.dump(dict(provenance=prov, mode="gpu" if gpu else "cpu-interpreter", rows=rows,
                                   partial=True), f, indent=1)
            if gpu:
                torch.cuda.empty_cache()

    table = Table(title="results (µs call: whole call incl. host launch; TFLOPS, GB/s, % roofline, ratio: "
                        "CUDA-graph replay, L2 flushed)" if gpu else "correctness (Triton interpreter vs reference)")
    for col in ("suite", "op / shape", "provider", "status", "check"):
        table.add_column(col)
    if gpu:
        for col in ("µs call", "µs graph", "TFLOPS", "GB/s", "% roofline", "ratio vs anchor", "target"):
            table.add_column(col, justify="right")
    for r in rows:
        cells = [r["suite"], r["name"], r["provider"],
                 {"PASS": "[green]PASS[/green]", "FAIL": "[red]FAIL[/red]"}.get(r["status"], r["status"]),
                 r["metric"]]
        if gpu:
            ratio = " ".join(f"{v:.2f}x" for v in r.get("ratio_vs", {}).values())
            cells += [_fmt(r.get("us"), ".1f"), _fmt(r.get("graph_us"), ".1f"), _fmt(r.get("tflops"), ".0f"), _fmt(r.get("gbps"), ".0f"),
                      _fmt(r.get("pct_roofline"), ".0f"), ratio, r["target"] if r["provider_kind"] == "ours" else ""]
        table.add_row(*cells)
    console.print(table)

    result = dict(provenance=prov, mode="gpu" if gpu else "cpu-interpreter", rows=rows)
    if not gpu:
        ana = analytical_rows(build_cases("cpu", small=False, quick=args.quick, only=args.only))
        t2 = Table(title="H200 roofline for the production shapes — ANALYTICAL, not measurements: lower bound "
                         "from datasheet peaks (989/1979 TFLOPS, 4.8 TB/s); on our measured ceilings beside it")
        for col in ("suite", "op / shape", "GFLOP", "MB moved", "bound", "lower bound µs", "measured-ceiling µs",
                    "target"):
            t2.add_column(col)
        for a in ana:
            t2.add_row(a["suite"], a["name"], f"{a['flops'] / 1e9:.1f}", f"{a['bytes'] / 1e6:.1f}", a["bound"],
                       f"{a['roofline_us']:.1f}", f"{a['measured_ceiling_us']:.1f}", a["target"])
        console.print(t2)
        result["analytical"] = ana
    if args.json:
        with open(args.json, "w") as f:
            json.dump(result, f, indent=1)
        console.print(f"wrote {args.json}")
    if args.plot:
        if gpu:
            from .roofline import plot_roofline

            plot_roofline([r for r in rows if r.get("us")], args.plot)
            console.print(f"wrote {args.plot}")
        else:
            console.print("--plot needs measured rows (a GPU run); nothing plotted")
    failed = sum(r["status"] == "FAIL" for r in rows)
    console.print(f"{len(rows)} rows, {failed} FAIL")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
