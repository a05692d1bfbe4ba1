"""The raw baseline for the all-reduce benchmark: plain torch.distributed under torchrun.

No workbench import: this is what a user would write by hand. Rank 0 prints one JSON line
``{"samples": [[bytes, median_seconds], ...]}``.

    .venv/bin/torchrun --nproc-per-node 2 --master-addr 127.0.0.1 --master-port P \\
        benchmarks/raw_allreduce.py --sizes 4096 65536 --iters 5 --warmup 2
"""

from __future__ import annotations

import argparse
import json
import statistics
import time

import torch
import torch.distributed as dist


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--sizes", type=int, nargs="+", required=True)
    parser.add_argument("--iters", type=int, default=5)
    parser.add_argument("--warmup", type=int, default=2)
    args = parser.parse_args()
    torch.set_num_threads(1)
    dist.init_process_group("gloo")
    try:
        samples = []
        for size in args.sizes:
            buf = torch.ones(max(1, size // 4), dtype=torch.float32)
            for _ in range(args.warmup):
                dist.all_reduce(buf)
            times = []
            for _ in range(args.iters):
                dist.barrier()
                start = time.perf_counter()
                dist.all_reduce(buf)
                times.append(time.perf_counter() - start)
            samples.append([buf.numel() * 4, statistics.median(times)])
        if dist.get_rank() == 0:
            print(json.dumps({"samples": samples}), flush=True)
    finally:
        dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
