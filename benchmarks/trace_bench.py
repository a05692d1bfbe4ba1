"""Tracing overhead: traced vs untraced training step (DP and TP, 2 ranks) vs torch.profiler.

DP reuses ``benchmarks/trace_overhead.py`` (a hand-built DDP step with the tracers the
stepper installs); TP uses ``benchmarks/trace_tp.py`` (the workbench's own DTensor
``TrainStep``). Both interleave the variants step by step on the same ranks.

    .venv/bin/python -m benchmarks.trace_bench [--quick]
"""

from __future__ import annotations

from typing import Any

from benchmarks import trace_overhead, trace_tp
from benchmarks.common import BenchResult, Row, Target, run_main, spawn_ranks

__all__ = ["NAME", "TITLE", "run"]

NAME = "trace_overhead"
TITLE = "Tracing overhead: traced vs untraced step, and torch.profiler on the same step"


def _rows(label: str, summary: dict[str, Any], target: float) -> tuple[list[Row], str]:
    """Rows from the worst rank (highest traced/untraced wall ratio)."""
    ranks = summary["ranks"]
    worst = max(range(len(ranks)), key=lambda r: ranks[r]["wall"]["ratio"]["traced"])
    wall = ranks[worst]["wall"]
    med, n = wall["median_s"], ranks[worst]["samples"]
    rows = [
        Row.compare(
            f"{label} step, traced vs untraced (wall, worst rank)",
            "ms",
            med["traced"] * 1e3,
            med["untraced"] * 1e3,
            raw_label="untraced",
            target=Target("<=", target),
            samples=n,
        ),
        Row.compare(
            f"{label} step, traced vs torch.profiler (shapes+memory)",
            "ms",
            med["traced"] * 1e3,
            med["profiler+mem"] * 1e3,
            raw_label="profiler",
            target=Target("<", 1.0, "< 1 (below the profiler)"),
            samples=n,
        ),
    ]
    parts = []
    for r, rank in enumerate(ranks):
        for clock in ("wall", "cpu"):
            ratio = rank[clock]["ratio"]
            parts.append(
                f"rank {r} {clock}: traced x{ratio['traced']:.3f}, profiler "
                f"x{ratio['profiler']:.3f}, profiler+mem x{ratio['profiler+mem']:.3f}"
            )
    events = ", ".join(str(rank["comm_events"]) for rank in ranks)
    errors = [e for rank in ranks for e in rank["errors"]]
    note = (
        f"{label}: ratios to untraced - " + "; ".join(parts) + f"; comm events per rank: {events}"
    )
    if errors:
        note += f"; tracer errors: {errors}"
    return rows, note


def run(quick: bool = False) -> BenchResult:
    repeats, warmup = (2, 1) if quick else (12, 2)
    # quick: a tiny TP model so a smoke run stays short (the numbers then mean little)
    dp_model, tp_model, tp_batch = "mlp", "gpt-tiny" if quick else "gpt-small", 8
    result = BenchResult(
        NAME,
        TITLE,
        ran=f"2 gloo ranks, 1 thread each, variants interleaved in rotating order, "
        f"{repeats} steps each after {warmup} warm-up: DP = DDP on trace_overhead's "
        f"'{dp_model}' model (6x1024 MLP, batch 256/rank) with MemoryTracer + CommTracer + "
        f"DDP attached + phase spans; TP = the workbench TrainStep, strategy='tp', "
        f"{tp_model}, global batch {tp_batch}, RunSpec(trace=True) vs trace=False; "
        "profiler = torch.profiler (CPU) with record_shapes + profile_memory",
    )
    dp = spawn_ranks(trace_overhead._rank_main, (dp_model, repeats, warmup))
    dp_summary = trace_tp.summarise(dp)
    rows, note = _rows("DP", dp_summary, trace_overhead.TARGET_RATIO)
    result.rows += rows
    result.notes.append(note)
    tp = spawn_ranks(trace_tp.rank_main, (tp_model, tp_batch, repeats, warmup))
    tp_summary = trace_tp.summarise(tp)
    rows, note = _rows("TP", tp_summary, trace_overhead.TARGET_RATIO)
    result.rows += rows
    result.notes.append(note)
    result.details = {"dp": dp_summary, "tp": tp_summary}
    return result


if __name__ == "__main__":
    raise SystemExit(run_main(run))
