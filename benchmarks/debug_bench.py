"""What being ready for a rank's ``breakpoint()`` costs a cell, and one pdb command's round
trip (issue 45).

A notebook's ``%%wb`` sends every cell with a prompter (``on_prompt``): the direct request
carries the kernel's debug address, a cell through the controller carries it as its label,
and the wait loop reads the debug socket. Measured: ``cluster.execute`` of a trivial cell
with a prompter against the same call without, on both paths (target <= 1.1); and, absolute,
the seconds from one ``[rank 1] (Pdb)`` prompt to the next when a prompter answers at once
(``p 1``, 40 times), against the same command typed into a local pdb (no transport).

    .venv/bin/python -m benchmarks.debug_bench [--quick]
"""

from __future__ import annotations

import functools
import io
import pdb
import time
from collections.abc import Callable

from benchmarks.common import BenchResult, Row, Target, interleaved, median, run_main, timed

__all__ = ["NAME", "TITLE", "run"]

NAME = "debug"
TITLE = "Breakpoint readiness per cell, and a pdb command's round trip to a rank"
TARGET = Target("<=", 1.1)
CELL = "x = 1"
COMMANDS = 40


class _Answers:
    """A prompter answering ``p 1`` ``n`` times, then ``c``; counts what it saw."""

    def __init__(self, n: int) -> None:
        self.left = n
        self.asked = 0

    def why_not(self) -> str | None:
        return None

    def ask(self, rank: int, output: str, prompt: str) -> str:
        self.asked += 1
        if self.left == 0:
            return "c"
        self.left -= 1
        return "p 1"

    def show(self, rank: int, output: str) -> None:
        """Nothing to show."""


def _timer(fn: Callable[[], object]) -> Callable[[], float]:
    return functools.partial(timed, fn)


def _local_pdb_s(n: int) -> float:
    """Seconds per ``p 1`` in a local pdb reading from memory (no transport at all)."""
    answers = io.StringIO("p 1\n" * n + "c\n")
    debugger = pdb.Pdb(stdin=answers, stdout=io.StringIO(), nosigint=True, readrc=False)
    debugger.use_rawinput = False
    start = time.perf_counter()
    debugger.set_trace()
    _ = 1  # where it stops; the commands run here
    return (time.perf_counter() - start) / (n + 1)


def run(quick: bool = False) -> BenchResult:
    from workbench.cluster import Cluster

    repeats, warmup = (5, 2) if quick else (60, 5)
    rounds = 2 if quick else 7
    cluster = Cluster(n=2, backend="gloo")
    prompter = _Answers(0)
    try:
        cluster.start_sync()
        samples = interleaved(
            {
                "direct, prompter": _timer(lambda: cluster.execute(CELL, on_prompt=prompter)),
                "direct": _timer(lambda: cluster.execute(CELL)),
                "controller, prompter": _timer(
                    lambda: cluster.execute(CELL, direct=False, on_prompt=prompter)
                ),
                "controller": _timer(lambda: cluster.execute(CELL, direct=False)),
            },
            repeats=repeats,
            warmup=warmup,
        )
        per_command: list[float] = []
        for _ in range(rounds):
            answers = _Answers(COMMANDS)
            start = time.perf_counter()
            [result] = cluster.execute("breakpoint()\n_ = 1", ranks=1, on_prompt=answers)
            seconds = time.perf_counter() - start
            if not result.ok or answers.asked != COMMANDS + 1:
                raise RuntimeError(f"the breakpoint run went wrong: {result}, {answers.asked}")
            per_command.append(seconds / (COMMANDS + 1))
    finally:
        cluster.stop_sync()
    local = median([_local_pdb_s(COMMANDS) for _ in range(rounds)])
    med = {k: median(v) * 1e3 for k, v in samples.items()}
    result = BenchResult(
        NAME,
        TITLE,
        ran=f"2-engine gloo cluster; cell {CELL!r} through cluster.execute with and without a "
        f"prompter, 4 variants interleaved, {repeats} calls each after {warmup} warm-up, "
        f"median; a breakpoint on rank 1 answered {COMMANDS} x 'p 1' then 'c', {rounds} "
        "rounds, median seconds per command",
        details={"median_ms": med, "per_command_ms": [s * 1e3 for s in per_command]},
    )
    for metric, ours, theirs in (
        ("trivial cell, direct: with a prompter vs without", "direct, prompter", "direct"),
        (
            "trivial cell, controller: with a prompter vs without",
            "controller, prompter",
            "controller",
        ),
    ):
        result.rows.append(
            Row.compare(
                metric, "ms", med[ours], med[theirs], raw_label=theirs, target=TARGET,
                samples=repeats,
            )
        )  # fmt: skip
    result.rows.append(
        Row.compare(
            "one pdb command on rank 1, prompt to prompt",
            "ms",
            median(per_command) * 1e3,
            local * 1e3,
            raw_label="local pdb, no transport",
            target=None,
            samples=rounds,
            note="absolute: what a person waits after pressing Enter",
        )
    )
    return result


if __name__ == "__main__":
    raise SystemExit(run_main(run))
