"""``workbench calibrate``: measure all-reduce on local gloo ranks, fit α and B, save JSON.

The saved profile is a planner ``HardwareSpec`` (``workbench plan --hardware-json``), so
plans of CPU runs use this machine's measured link and matmul rate.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Any

from workbench.cli.numbers import count
from workbench.errors import ConfigError
from workbench.planner import fit_alpha_beta, hardware_from_fit

__all__ = ["measure_matmul_flops", "register", "run"]


def register(subparsers: Any) -> None:
    p = subparsers.add_parser(
        "calibrate",
        help="measure local all-reduce and fit the planner's latency/bandwidth",
        description="Run an all-reduce size sweep on local gloo processes (127.0.0.1), "
        "fit t = 2(n-1)·α + 2(n-1)/n·S/B, and print or save the hardware profile.",
    )
    # Every number is checked by argparse, before any rank starts.
    p.add_argument("--world-size", type=count(2, 64), default=2)
    p.add_argument(
        "--sizes",
        type=count(1, 2**31),
        nargs="+",
        help="message sizes in bytes, at least two different (default 4 KiB..16 MiB)",
    )
    p.add_argument("--iters", type=count(1, 10_000), default=5)
    p.add_argument("--warmup", type=count(0, 10_000), default=2)
    p.add_argument("--out", type=Path, help="write the profile JSON here")
    p.add_argument("--json", action="store_true", help="print the profile JSON")
    p.add_argument("--no-flops", action="store_true", help="skip the matmul rate measurement")
    p.set_defaults(handler=run)


def measure_matmul_flops(n: int = 512, repeats: int = 5) -> float:
    """Best-of fp32 matmul FLOP/s on one thread (what one rank of a CPU run gets)."""
    import torch

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        a, b = torch.randn(n, n), torch.randn(n, n)
        a @ b  # warm-up
        best = float("inf")
        for _ in range(repeats):
            start = time.perf_counter()
            a @ b
            best = min(best, time.perf_counter() - start)
    finally:
        torch.set_num_threads(threads)
    return 2.0 * n**3 / best


def run(args: argparse.Namespace) -> int:
    if args.sizes is not None and len(set(args.sizes)) < 2:
        raise ConfigError(
            f"--sizes {' '.join(map(str, args.sizes))} is not valid; give at least two "
            "different sizes (the fit needs them to separate latency from bandwidth)"
        )
    # torch is imported only once the arguments are known to be good.
    from workbench.parallel.planning.commbench import DEFAULT_SIZES, run_local_sweep

    sizes = list(args.sizes or DEFAULT_SIZES)
    samples = run_local_sweep(args.world_size, sizes=sizes, iters=args.iters, warmup=args.warmup)
    fit = fit_alpha_beta(samples, n=args.world_size)
    flops = None if args.no_flops else measure_matmul_flops()
    hardware = hardware_from_fit(fit, peak_flops=flops or 1e11)
    profile = {"fit": fit.as_dict(), "matmul_flops": flops, "hardware": hardware.to_dict()}
    if args.out is not None:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(profile, indent=2) + "\n")
    out = sys.stdout
    if args.json:
        json.dump(profile, out, indent=2)
        out.write("\n")
        return 0
    out.write(
        f"all-reduce over {fit.n} gloo ranks on 127.0.0.1: latency α = {fit.latency * 1e6:.1f} µs, "
        f"bandwidth B = {fit.bandwidth / 1e9:.3f} GB/s (rms error {fit.rms_rel_error:.0%})\n"
    )
    out.write(f"{'bytes':>12}{'measured ms':>14}{'fitted ms':>12}\n")
    for size, secs in fit.samples:
        out.write(f"{size:>12}{secs * 1e3:>14.3f}{fit.predict(size) * 1e3:>12.3f}\n")
    if flops:
        out.write(f"fp32 matmul, 1 thread: {flops / 1e9:.1f} GFLOP/s\n")
    if args.out is not None:
        out.write(f"saved {args.out} (use: workbench plan --hardware-json {args.out})\n")
    return 0
