"""Roofline model of one MLA layer's decode step: FLOPs and HBM bytes of each op from its shapes, arithmetic
intensity, the machine balance of H800 / H200 / B200 from datasheet rates, and a compute- or memory-bound verdict.

Ops of the absorbed decode step, for ``b`` requests × ``s_q`` new tokens (T = b·s_q) over ``s_k`` cached tokens:

    q_a_proj, q_b_proj, kv_a_proj_with_mqa, o_proj   FP8 GEMMs (DeepGEMM), 1-byte weights, bf16 activations
    absorb W^UK, apply W^UV                           per-head bf16 batched GEMMs (H × [T,128]×[128,512])
    flash_mla decode                                   FLOPs 2·b·h_q·s_q·s_k·(d_qk + d_v); bytes = the cache rows
                                                      (b·s_k·bytes_per_token) + q and out

The attention's intensity tends to ``h_q·s_q·(d_qk+d_v)/d_qk ≈ 1.89·h_q·s_q`` for a BF16 cache and long s_k
(≈ 2·h_q·s_q in the FlashMLA deep dive, which rounds (576+512)/576 to 2); a packed cache divides the bytes by
1152/bytes_per_token. Units: FLOP, bytes, FLOP/byte, TFLOPS = 1e12 FLOP/s, TB/s = 1e12 B/s, µs.
Datasheet rates are dense (no 2:4 sparsity); achieved ceilings are lower (bench/roofline.py keeps the measured
H200 ones; the seed quotes ~865 TFLOPS for a down-clocked H800).
"""
from __future__ import annotations

import argparse
from dataclasses import dataclass

from .config import MLAConfig
from .kv_accounting import KV_FORMAT_BYTES, KV_FORMAT_DIMS

__all__ = ["GPUSpec", "GPUS", "OpCost", "mla_decode_ops", "attention_intensity", "add_roofline_parser",
           "run_roofline", "main"]


@dataclass(frozen=True)
class GPUSpec:
    name: str
    bf16_tflops: float   # dense BF16 tensor-core peak, datasheet
    fp8_tflops: float    # dense FP8 tensor-core peak, datasheet
    hbm_tbps: float      # HBM bandwidth, datasheet, 1e12 B/s
    source: str

    def peak(self, mma: str) -> float:
        return self.fp8_tflops if mma == "fp8" else self.bf16_tflops

    def balance(self, mma: str = "bf16") -> float:
        """Machine balance, FLOP per byte: peak rate over bandwidth."""
        return self.peak(mma) / self.hbm_tbps


GPUS = {
    "h800": GPUSpec("NVIDIA H800 SXM5", 989.0, 1979.0, 3.35, "NVIDIA H800 datasheet (seed §10)"),
    "h200": GPUSpec("NVIDIA H200 SXM", 989.0, 1979.0, 4.8, "NVIDIA H200 datasheet (141 GB HBM3e)"),
    "b200": GPUSpec("NVIDIA B200 (HGX)", 2250.0, 4500.0, 8.0, "NVIDIA HGX B200 datasheet, dense = half the sparse rate"),
}


@dataclass(frozen=True)
class OpCost:
    op: str
    shape: str
    flops: float
    bytes: float
    mma: str   # "bf16" or "fp8": which peak applies

    @property
    def intensity(self) -> float:
        return self.flops / self.bytes

    def verdict(self, gpu: GPUSpec) -> str:
        return "compute-bound" if self.intensity >= gpu.balance(self.mma) else "memory-bound"

    def time_us(self, gpu: GPUSpec) -> float:
        """Roofline lower bound: the larger of FLOPs/peak and bytes/bandwidth."""
        return max(self.flops / (gpu.peak(self.mma) * 1e12), self.bytes / (gpu.hbm_tbps * 1e12)) * 1e6


def _fp8_gemm(op: str, m: int, n: int, k: int) -> OpCost:
    # FP8 weight [n, k] + fp32 scale per 128×128 block, bf16 activation in [m, k] and out [m, n]
    w = n * k + 4 * (-(-n // 128)) * (-(-k // 128))
    return OpCost(op, f"[{m},{k}]x[{k},{n}]", 2.0 * m * n * k, w + 2.0 * m * k + 2.0 * m * n, "fp8")


def _bmm(op: str, g: int, m: int, n: int, k: int) -> OpCost:
    return OpCost(op, f"{g}x[{m},{k}]x[{k},{n}]", 2.0 * g * m * n * k, 2.0 * (g * n * k + g * m * k + g * m * n),
                  "bf16")


def attention_cost(b: int, s_q: int, h_q: int, s_k: int, kv_format: str = "bf16") -> OpCost:
    """flash_mla decode over ``s_k`` cached tokens per request (all tokens attended; sparse: s_k = topk)."""
    if kv_format not in KV_FORMAT_BYTES:
        raise ValueError(f"kv_format must be one of {list(KV_FORMAT_BYTES)}, got {kv_format!r}")
    d_qk, d_v = KV_FORMAT_DIMS[kv_format]
    flops = 2.0 * b * h_q * s_q * s_k * (d_qk + d_v)
    nbytes = b * s_k * KV_FORMAT_BYTES[kv_format] + 2.0 * b * s_q * h_q * (d_qk + d_v)
    return OpCost(f"flash_mla ({kv_format})", f"b={b} s_q={s_q} h_q={h_q} s_k={s_k}", flops, nbytes, "bf16")


def attention_intensity(h_q: int, s_q: int, kv_format: str = "bf16") -> float:
    """Long-context limit of the decode intensity (cache bytes only): ``h_q·s_q·(d_qk+d_v)·2 / bytes_per_token``."""
    d_qk, d_v = KV_FORMAT_DIMS[kv_format]
    return 2.0 * h_q * s_q * (d_qk + d_v) / KV_FORMAT_BYTES[kv_format]


def mla_decode_ops(cfg: MLAConfig, b: int, s_q: int, s_k: int, kv_format: str = "bf16") -> list[OpCost]:
    """Every op of one absorbed MLA decode step with ``cfg``'s shapes (heads = ``cfg.num_heads``)."""
    if min(b, s_q, s_k) <= 0:
        raise ValueError(f"b, s_q and s_k must be > 0, got {b}, {s_q}, {s_k}")
    c, t, h = cfg, b * s_q, cfg.num_heads
    ops = []
    if c.q_lora_rank is None:
        ops.append(_fp8_gemm("q_proj", t, h * c.qk_head_dim, c.hidden_size))
    else:
        ops += [_fp8_gemm("q_a_proj", t, c.q_lora_rank, c.hidden_size),
                _fp8_gemm("q_b_proj", t, h * c.qk_head_dim, c.q_lora_rank)]
    ops += [_fp8_gemm("kv_a_proj_with_mqa", t, c.kv_cache_dim, c.hidden_size),
            _bmm("absorb W_UK (q_nope -> latent)", h, t, c.kv_lora_rank, c.qk_nope_head_dim),
            attention_cost(b, s_q, h, s_k, kv_format),
            _bmm("apply W_UV (latent -> v)", h, t, c.v_head_dim, c.kv_lora_rank),
            _fp8_gemm("o_proj", t, c.hidden_size, h * c.v_head_dim)]
    return ops


def add_roofline_parser(sub) -> argparse.ArgumentParser:
    """Register ``roofline`` on an argparse subparsers object (for the ``deepkernels`` command line)."""
    p = sub.add_parser("roofline", help="analytical roofline of one MLA decode step (no device needed)")
    p.add_argument("--gpu", choices=sorted(GPUS), default="h200")
    p.add_argument("--heads", type=int, default=128, help="query heads h_q (128 for V3 without TP)")
    p.add_argument("--s-q", type=int, default=1, help="query tokens per request (1; >1 with MTP/speculation)")
    p.add_argument("--batch", type=int, default=64)
    p.add_argument("--s-k", type=int, default=4096, help="cached tokens per request (topk for sparse decode)")
    p.add_argument("--kv-format", choices=list(KV_FORMAT_BYTES), default="bf16")
    return p


def run_roofline(args) -> int:
    """Print the table for parsed ``args`` (see :func:`add_roofline_parser`)."""
    from rich.console import Console
    from rich.table import Table

    gpu = GPUS[args.gpu]
    cfg = MLAConfig.deepseek_v3(num_heads=args.heads)
    ops = mla_decode_ops(cfg, args.batch, args.s_q, args.s_k, args.kv_format)
    con = Console(width=max(Console().width, 160))   # piped output: keep the columns whole
    con.print(f"[bold]{gpu.name}[/bold] ({gpu.source}): BF16 {gpu.bf16_tflops:.0f} TFLOPS, FP8 "
              f"{gpu.fp8_tflops:.0f} TFLOPS, HBM {gpu.hbm_tbps:.2f} TB/s -> machine balance "
              f"{gpu.balance('bf16'):.0f} FLOP/B (BF16), {gpu.balance('fp8'):.0f} FLOP/B (FP8)")
    tab = Table(title=f"DeepSeek-V3 MLA decode step, h_q={args.heads}, s_q={args.s_q}, b={args.batch}, "
                      f"s_k={args.s_k}, KV {args.kv_format} — ANALYTICAL, not measured")
    for col in ("op", "shape", "GFLOP", "MB", "FLOP/B", "balance", "verdict", "µs (lower bound)"):
        tab.add_column(col)
    for o in ops:
        tab.add_row(o.op, o.shape, f"{o.flops / 1e9:.3f}", f"{o.bytes / 1e6:.3f}", f"{o.intensity:.1f}",
                    f"{gpu.balance(o.mma):.0f} ({o.mma})", o.verdict(gpu), f"{o.time_us(gpu):.2f}")
    con.print(tab)
    ai = attention_intensity(args.heads, args.s_q, args.kv_format)
    att = ops[[i for i, o in enumerate(ops) if o.op.startswith("flash_mla")][0]]
    con.print(f"decode attention intensity: 2·h_q·s_q = {2 * args.heads * args.s_q} (approximation); exact "
              f"long-context limit {ai:.1f} FLOP/B; with q/out at s_k={args.s_k}: {att.intensity:.1f} -> "
              f"{att.verdict(gpu)} on {gpu.name} (balance {gpu.balance('bf16'):.0f})")
    return 0


def main(argv: list[str] | None = None) -> int:
    """``python -m deepkernels.model.roofline --gpu h200 --heads 128 --s-q 1``."""
    parser = argparse.ArgumentParser(prog="deepkernels")
    sub = parser.add_subparsers(dest="command", required=True)
    add_roofline_parser(sub)
    import sys
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] != "roofline":
        argv = ["roofline", *argv]
    return run_roofline(parser.parse_args(argv))


if __name__ == "__main__":
    raise SystemExit(main())
