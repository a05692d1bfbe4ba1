"""``%wb start`` after the kernel has been idle: the workbench kernel vs the plain kernel.

A user opens a notebook, reads, then starts a cluster. In the workbench kernel
(``workbench.kernel_launcher``) the engines' forker and the controller were started with
the kernel and finished their imports while it sat idle; in the plain Python kernel
``%wb start`` starts both and waits for their imports. Each sample is a fresh kernel
through nbclient: ``%load_ext workbench``, an idle cell of ``IDLE_S`` seconds, the timed
``%wb start -n N``, a 1-element all-reduce cell (checked), ``%wb stop``. Interleaved in
rotating order; medians.

    .venv/bin/python -m benchmarks.kernel_start_bench [--quick]
"""

from __future__ import annotations

import asyncio
import sys
from pathlib import Path

from benchmarks.common import BenchResult, Row, interleaved, median, run_main
from benchmarks.notebook_driver import KernelSpec, NotebookRun, spec_dir

__all__ = ["NAME", "TITLE", "run"]

NAME = "kernel_start"
TITLE = "%wb start after the kernel has been idle: workbench kernel vs plain Python kernel"
IDLE_S = 6.0  # long enough for both imports to finish on a busy 2-core machine
KERNELS = {
    "plain kernel": ["-m", "ipykernel_launcher"],
    "workbench kernel": ["-m", "workbench.kernel_launcher"],
}
MARKER = "allreduce="


def _cells(n: int) -> list[str]:
    return [
        "%load_ext workbench",
        f"import time\ntime.sleep({IDLE_S})",
        f"%wb start -n {n}",
        '%%wb\nt = torch.ones(1) * (rank + 1)\ndist.all_reduce(t)\nprint(f"allreduce={t.item()}")',
    ]


async def _one(kernel: str, n: int, kernels: str) -> float:
    run = NotebookRun(KernelSpec(kernel, []), Path(kernels), env={"OMP_NUM_THREADS": "1"})
    try:
        times = await run.start(_cells(n), MARKER)
        expected = f"{MARKER}{n * (n + 1) / 2}"
        if times.marker_cell_text.count(expected) < n:
            raise RuntimeError(f"{kernel}: the all-reduce printed {times.marker_cell_text!r}")
        await run.stop("%wb stop")
        left = times.left_after_stop
        if left:
            raise RuntimeError(f"{kernel}: alive after %wb stop: {left}")
        return times.cells_s[2] - times.cells_s[1]  # the %wb start cell alone
    finally:
        await run.close()


def run(quick: bool = False) -> BenchResult:
    sizes, repeats = ((2,), 1) if quick else ((2, 4), 3)
    specs = [
        KernelSpec(name, [sys.executable, *argv, "-f", "{connection_file}"])
        for name, argv in KERNELS.items()
    ]
    kernels = str(spec_dir(specs))
    result = BenchResult(
        NAME,
        TITLE,
        ran=f"a fresh kernel per sample; {IDLE_S:.0f} s idle before %wb start; ranks "
        f"{list(sizes)}; {repeats} starts per kernel and size, interleaved",
    )
    for n in sizes:
        samples = interleaved(
            {k: (lambda k=k, n=n: asyncio.run(_one(k, n, kernels))) for k in KERNELS},
            repeats=repeats,
        )
        result.details[f"start:{n}"] = samples
        result.rows.append(
            Row.compare(
                f"{n} ranks: %wb start after {IDLE_S:.0f} s idle, workbench kernel vs plain",
                "s",
                median(samples["workbench kernel"]),
                median(samples["plain kernel"]),
                raw_label="plain kernel",
                target=None,
                samples=repeats,
            )
        )
    return result


if __name__ == "__main__":
    raise SystemExit(run_main(run))
