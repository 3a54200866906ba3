"""``deepkernels rails plan``: print the TMEM plan of a decode CTA and the seed's QK resource table.

Usage (standalone, or wired into the ``deepkernels`` command through :func:`add_rails_parser`)::

    python -m deepkernels.rails plan --heads 64 --d 512 --topk-block 64
    deepkernels rails plan --heads 64 --d 512 --topk-block 64      # once bench/cli.py registers the parser

Exit status 0 when the plan fits, 2 when the configuration is illegal or needs more than 512 columns (the
resource table is still printed, since it is also meant for layouts that do not fit).
"""
from __future__ import annotations

import argparse
import sys

from .planner import DTYPES, DecodeConfig, format_resource_table, plan_tmem, resource_table

__all__ = ["add_rails_parser", "run_plan", "main"]


def _add_plan_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--heads", type=int, default=64, help="query heads per CTA = M of the QK MMA (32, 64, 128)")
    p.add_argument("--d", type=int, default=512, help="NoPE features of the QK GEMM (= d_v), default 512")
    p.add_argument("--d-rope", type=int, default=64, help="RoPE features of Q kept in TMEM (64 for d_qk 576; 0)")
    p.add_argument("--dtype", choices=sorted(DTYPES), default="bf16", help="Q/K dtype (kind::f16)")
    p.add_argument("--topk-block", type=int, default=64, help="tokens per QK step (B_TOPK)")
    p.add_argument("--rails", type=int, default=2, help="NUM_MRGEMM_RAILS; 1 = the official .ws filling")
    p.add_argument("--p-buffers", type=int, default=1, help="number of P buffers (2 for ping-pong)")
    p.set_defaults(_rails_func=run_plan)


def add_rails_parser(subparsers) -> argparse.ArgumentParser:
    """Register ``rails plan`` on an ``argparse`` subparsers object (for the ``deepkernels`` command).

    The handler is stored as ``args._rails_func``; call ``args._rails_func(args)`` to run it.
    """
    rails = subparsers.add_parser("rails", help="Blackwell multi-rail GEMM: TMEM planner and resource table")
    sub = rails.add_subparsers(dest="rails_cmd", required=True)
    _add_plan_args(sub.add_parser("plan", help="print the TMEM plan and the QK resource table"))
    return rails


def run_plan(args: argparse.Namespace, out=None) -> int:
    """Print the plan and the resource table for the parsed arguments; return the exit status."""
    out = sys.stdout if out is None else out
    try:
        config = DecodeConfig(heads=args.heads, d=args.d, d_rope=args.d_rope, dtype=args.dtype,
                              topk_block=args.topk_block, rails=args.rails, p_buffers=args.p_buffers)
    except ValueError as e:
        print(f"error: {e}", file=out)
        return 2
    status = 0
    try:
        print(plan_tmem(config).format(), file=out)
    except ValueError as e:
        print(f"error: {e}", file=out)
        status = 2
    print("", file=out)
    print(f"QK resources (T={config.topk_block}, D={config.d}, {config.heads} heads; RoPE part not counted):",
          file=out)
    print(format_resource_table(resource_table(config)), file=out)
    return status


def main(argv=None) -> int:
    """Entry point of ``python -m deepkernels.rails``."""
    parser = argparse.ArgumentParser(prog="deepkernels rails", description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="rails_cmd", required=True)
    _add_plan_args(sub.add_parser("plan", help="print the TMEM plan and the QK resource table"))
    args = parser.parse_args(argv)
    return args._rails_func(args)
