"""Roofline of the GPUs deepkernels targets, and the PNG plot of measured ops against it.

Ceilings are the H200 numbers measured on our machine (shared/ANCHORS.md: 4.28 TB/s device-to-device copy,
~790 TFLOPS BF16 ``torch.matmul`` 8192³, 1274 TFLOPS FP8 ``torch._scaled_mm``), with the datasheet values kept
alongside. Analytical times on a CPU-only machine are labelled as such and are never reported as measurements.
"""
from __future__ import annotations

from dataclasses import dataclass

__all__ = ["GPUCeilings", "H200", "roofline_time_us", "plot_roofline"]


@dataclass(frozen=True)
class GPUCeilings:
    name: str
    hbm_gbps: float            # measured bandwidth, GB/s (1e9 B/s)
    bf16_tflops: float         # measured dense BF16 tensor-core rate
    fp8_tflops: float          # measured dense FP8 tensor-core rate
    hbm_gbps_datasheet: float
    bf16_tflops_datasheet: float
    fp8_tflops_datasheet: float

    def peak_tflops(self, dtype: str, datasheet: bool = False) -> float:
        if datasheet:
            return self.fp8_tflops_datasheet if dtype == "fp8" else self.bf16_tflops_datasheet
        return self.fp8_tflops if dtype == "fp8" else self.bf16_tflops

    def bandwidth_gbps(self, datasheet: bool = False) -> float:
        return self.hbm_gbps_datasheet if datasheet else self.hbm_gbps


H200 = GPUCeilings("NVIDIA H200", hbm_gbps=4280.0, bf16_tflops=790.0, fp8_tflops=1274.0,
                   hbm_gbps_datasheet=4800.0, bf16_tflops_datasheet=989.0, fp8_tflops_datasheet=1979.0)


def roofline_time_us(flops: float, nbytes: float, mma_dtype: str = "bf16", gpu: GPUCeilings = H200,
                     datasheet: bool = False) -> float:
    """Roofline time in µs: the larger of FLOPs over the tensor-core rate and bytes over bandwidth.

    ``datasheet=False`` uses the ceilings measured on our H200 (what "% of roofline" in a GPU run is relative to);
    ``datasheet=True`` uses the vendor peaks, which makes it a true lower bound (the analytical CPU table)."""
    t_compute = flops / (gpu.peak_tflops(mma_dtype, datasheet) * 1e12)
    t_memory = nbytes / (gpu.bandwidth_gbps(datasheet) * 1e9)
    return max(t_compute, t_memory) * 1e6


def plot_roofline(rows: list[dict], path: str, gpu: GPUCeilings = H200) -> None:
    """Write a log-log roofline PNG: both ceilings and every measured row (FLOP/B vs TFLOPS) as a point."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import numpy as np

    fig, ax = plt.subplots(figsize=(9, 6))
    x = np.logspace(-1, 4, 400)
    for dtype, style in (("bf16", "-"), ("fp8", "--")):
        peak = gpu.peak_tflops(dtype)
        ax.plot(x, np.minimum(peak, x * gpu.hbm_gbps / 1e3), style, color="gray",
                label=f"{dtype.upper()} ceiling ({peak:.0f} TFLOPS, {gpu.hbm_gbps / 1e3:.2f} TB/s)")
    markers = {"ours": "o", "anchor": "x"}
    suites = sorted({r["suite"] for r in rows})
    colors = dict(zip(suites, plt.cm.tab10.colors))
    for r in rows:
        if not r.get("us") or not r.get("bytes"):
            continue
        ai = r["flops"] / r["bytes"]
        tflops = r["flops"] / (r["us"] * 1e-6) / 1e12
        ax.scatter([ai], [tflops], marker=markers.get(r["provider_kind"], "o"), color=colors[r["suite"]], s=28)
    for s in suites:
        ax.scatter([], [], color=colors[s], label=s)
    ax.scatter([], [], marker="x", color="k", label="in-run anchor")
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel("arithmetic intensity (FLOP / byte of HBM traffic)")
    ax.set_ylabel("TFLOPS")
    ax.set_title(f"deepkernels on {gpu.name} (measured; ceilings measured on our H200)")
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=8, loc="lower right")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
