"""SM clock and power while a kernel runs back to back: how far each workload is from the tensor-core peak *at the
clock the card actually holds under it* (session 20).

The targets in ANCHORS.md are in TFLOPS; the H200's datasheet rates assume the boost clock (FP8 dense 1979 TFLOPS =
132 SMs x 4,096 FP8 MAC/clk x 2 x 1.83 GHz; BF16 half of that). Under a sustained tensor load the card may hold a
lower clock (power / thermal limits); then a TFLOPS target is a fraction of a smaller peak than it seems. This script
runs each workload in a loop for ``--seconds`` while a thread samples ``nvidia-smi --query-gpu`` every 100 ms
(read-only: clocks.sm, clocks.max.sm, power.draw, power.limit, temperature.gpu, clocks_event_reasons.active), and
reports per workload: achieved TFLOPS (CUDA events over the loop), the median sampled SM clock, the peak at that
clock and the fraction of it.

Usage: PYTHONPATH=src python benchmarks/clock_probe.py --out $OUT/clock.json [--seconds 3] [--dry]
(``--dry``: CPU, builds nothing, checks arguments and the sampler parsing only.)
"""
from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import threading
import time

FIELDS = "clocks.sm,clocks.max.sm,power.draw,power.limit,temperature.gpu,clocks_event_reasons.active"
FIELDS_BASIC = "clocks.sm,clocks.max.sm,power.draw,power.limit,temperature.gpu"   # if the driver lacks the reasons
FP8_MAC_PER_CLK_SM = 4096      # dense FP8 wgmma, per SM per clock (1979 TFLOPS at 1.83 GHz x 132 SMs)
BF16_MAC_PER_CLK_SM = 2048


def parse_sample(line: str) -> dict | None:
    """One ``nvidia-smi --format=csv,noheader,nounits`` line of FIELDS -> dict; None if unparsable."""
    parts = [p.strip() for p in line.split(",")]
    if len(parts) not in (5, 6):
        return None
    try:
        return {"sm_mhz": float(parts[0]), "max_sm_mhz": float(parts[1]), "power_w": float(parts[2]),
                "power_limit_w": float(parts[3]), "temp_c": float(parts[4]),
                "reasons": parts[5] if len(parts) == 6 else "n/a"}
    except ValueError:
        return None


class Sampler:
    def __init__(self):
        self.samples, self._stop = [], threading.Event()
        self._proc = None

    def __enter__(self):
        fields = FIELDS
        try:
            if subprocess.run(["nvidia-smi", f"--query-gpu={FIELDS}", "--format=csv,noheader,nounits"],
                              capture_output=True, timeout=20).returncode != 0:
                fields = FIELDS_BASIC
        except Exception:
            fields = FIELDS_BASIC
        self._proc = subprocess.Popen(["nvidia-smi", f"--query-gpu={fields}", "--format=csv,noheader,nounits",
                                       "-lms", "100"], stdout=subprocess.PIPE, text=True)
        self._t = threading.Thread(target=self._read, daemon=True)
        self._t.start()
        return self

    def _read(self):
        for line in self._proc.stdout:
            s = parse_sample(line)
            if s is not None:
                self.samples.append(s)

    def __exit__(self, *exc):
        self._proc.terminate()
        try:
            self._proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            self._proc.kill()


def workloads():
    import torch
    import deepkernels as dk
    from deepkernels.quant import per_block_cast_to_fp8, per_token_cast_to_fp8
    out = []
    m, n, k = 4096, 7168, 16384
    a = per_token_cast_to_fp8(torch.randn(m, k, device="cuda").bfloat16(), use_ue8m0=False)
    b = per_block_cast_to_fp8(torch.randn(n, k, device="cuda").bfloat16(), use_ue8m0=False)
    d = torch.empty(m, n, dtype=torch.bfloat16, device="cuda")
    out.append(("deepkernels fp8_gemm_nt 4096x7168x16384", 2 * m * n * k, FP8_MAC_PER_CLK_SM,
                lambda: dk.fp8_gemm_nt(a, b, d)))
    sfa, sfb = a[1].T.contiguous().T, b[1].contiguous().T
    out.append(("cuBLAS blockwise 4096x7168x16384", 2 * m * n * k, FP8_MAC_PER_CLK_SM,
                lambda: torch._scaled_mm(a[0], b[0].T, scale_a=sfa, scale_b=sfb, out_dtype=torch.bfloat16)))
    s = 8192
    x8 = torch.randn(s, s, device="cuda").to(torch.float8_e4m3fn)
    y8 = torch.randn(s, s, device="cuda").to(torch.float8_e4m3fn)
    one = torch.ones((), device="cuda")
    out.append(("cuBLAS FP8 per-tensor 8192^3", 2 * s ** 3, FP8_MAC_PER_CLK_SM,
                lambda: torch._scaled_mm(x8, y8.T, scale_a=one, scale_b=one, out_dtype=torch.bfloat16)))
    xb, yb = torch.randn(s, s, device="cuda").bfloat16(), torch.randn(s, s, device="cuda").bfloat16()
    out.append(("torch.matmul BF16 8192^3", 2 * s ** 3, BF16_MAC_PER_CLK_SM, lambda: xb @ yb))
    sys.path.insert(0, "tests")
    from test_mla_decode_reference import make_case
    q, kc, bt, sl = make_case(128, 1, 128, 1, [8192] * 128, device="cuda")
    meta = dk.get_mla_metadata()[0]
    flops = 2 * 128 * 128 * 8192 * (576 + 512)
    out.append(("deepkernels dense decode b128 h_q128 s_k8K", flops, BF16_MAC_PER_CLK_SM,
                lambda: dk.flash_mla_with_kvcache(q, kc, bt, sl, 512, meta)))
    return out


def run(seconds: float) -> list[dict]:
    import torch
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    rows = []
    for name, flops, mac_clk, fn in workloads():
        for _ in range(3):
            fn()
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        while time.perf_counter() - t0 < 0.5:     # calibrate calls per burst
            fn()
        torch.cuda.synchronize()
        with Sampler() as smp:
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            calls, t0 = 0, time.perf_counter()
            start.record()
            while time.perf_counter() - t0 < seconds:
                for _ in range(8):
                    fn()
                calls += 8
                if calls % 64 == 0:
                    end.record()
                    end.synchronize()       # keep the host from running far ahead of the device
            end.record()
            torch.cuda.synchronize()
        ms = start.elapsed_time(end)
        tflops = flops * calls / (ms * 1e-3) / 1e12
        busy = smp.samples[len(smp.samples) // 5:] or smp.samples   # drop the ramp
        mhz = statistics.median(s["sm_mhz"] for s in busy) if busy else None
        peak = 2 * mac_clk * sms * mhz * 1e6 / 1e12 if mhz else None
        rows.append({"workload": name, "calls": calls, "us_per_call": ms * 1e3 / calls, "tflops": tflops,
                     "sm_mhz_median": mhz, "sm_mhz_min": min((s["sm_mhz"] for s in busy), default=None),
                     "max_sm_mhz": busy[0]["max_sm_mhz"] if busy else None,
                     "power_w_median": statistics.median(s["power_w"] for s in busy) if busy else None,
                     "power_limit_w": busy[0]["power_limit_w"] if busy else None,
                     "temp_c_max": max((s["temp_c"] for s in busy), default=None),
                     "reasons": sorted({s["reasons"] for s in busy}),
                     "peak_tflops_at_clock": peak, "fraction_of_peak_at_clock": tflops / peak if peak else None,
                     "samples": len(busy)})
        r = rows[-1]
        print(f"{name}: {tflops:.0f} TFLOPS, SM {mhz} MHz (min {r['sm_mhz_min']}), {r['power_w_median']} W of "
              f"{r['power_limit_w']}, peak at clock {peak}, fraction {r['fraction_of_peak_at_clock']}, "
              f"reasons {r['reasons']}, {len(busy)} samples", flush=True)
    return rows


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", required=True)
    ap.add_argument("--seconds", type=float, default=3.0)
    ap.add_argument("--dry", action="store_true")
    args = ap.parse_args(argv)
    if args.dry:
        s = parse_sample("1980, 1980, 512.33, 700.00, 45, 0x0000000000000000")
        assert s and s["sm_mhz"] == 1980 and s["power_w"] == 512.33, s
        print("dry run ok", s)
        return 0
    import torch
    sys.path.insert(0, "benchmarks")
    from gemm import provenance
    rows = run(args.seconds)
    with open(args.out, "w") as f:
        json.dump({"provenance": provenance(), "seconds": args.seconds, "rows": rows,
                   "peak_model": {"fp8_mac_per_clk_sm": FP8_MAC_PER_CLK_SM, "bf16_mac_per_clk_sm": BF16_MAC_PER_CLK_SM},
                   "device_name": torch.cuda.get_device_name()}, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
