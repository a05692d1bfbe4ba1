"""The main job: one model under every strategy, traced, checked and reported.

``workbench demo`` starts local engines, runs the same model single-device, DDP, ZeRO/FSDP,
tensor parallel and pipeline parallel for a few steps with tracing, checks each against the
single-device run, compares measured memory with the planner's prediction, and writes a
self-contained HTML report plus a Perfetto trace per strategy.
"""

from __future__ import annotations

import statistics
import time
from collections import Counter, defaultdict
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from workbench.cluster import Cluster
from workbench.engine.equivalence import compare_with_reference
from workbench.parallel.planning.run_plan import strategy_plan
from workbench.parallel.run_spec import RunSpec
from workbench.planner import validate
from workbench.plots import comm_timeline_figure, loss_figure, memory_figure
from workbench.report import ReportSection, write_report
from workbench.session.training import TrainingSession
from workbench.trace import CommEvent, Event, MemorySample, Metric, PhaseSpan, to_perfetto

__all__ = ["DEFAULT_STRATEGIES", "StrategyResult", "run_demo", "write_demo_report"]

DEFAULT_STRATEGIES: tuple[str, ...] = ("dp", "zero1", "fsdp", "tp", "megatron", "pp")
MiB = 2**20


@dataclass(slots=True)
class StrategyResult:
    strategy: str
    events: list[Event] = field(default_factory=list)
    check: dict[str, Any] | None = None
    validation: dict[str, Any] | None = None
    seconds: float = 0.0

    def summary(self, steps: int) -> dict[str, Any]:
        """One row of the comparison table (rank 0 unless stated)."""
        samples = [e for e in self.events if isinstance(e, MemorySample)]
        comm = [e for e in self.events if isinstance(e, CommEvent) and e.rank == 0]
        spans = [e for e in self.events if isinstance(e, PhaseSpan) and e.rank == 0]
        per_step: dict[int, int] = defaultdict(int)
        for span in spans:
            if "[" not in span.phase:  # nested micro-batch spans are inside their phase
                per_step[span.step] += span.end - span.start
        state = max(
            (s.params + s.frozen + s.grads + s.optimizer for s in samples if s.rank == 0),
            default=0,
        )
        peak = {
            r: max((s.total for s in samples if s.rank == r), default=0)
            for r in sorted({s.rank for s in samples})
        }
        losses = [e.value for e in self.events if isinstance(e, Metric) and e.rank == 0]
        ops = Counter(e.op for e in comm)
        check = self.check or {}
        return {
            "strategy": self.strategy,
            "model state / rank (MiB)": round(state / MiB, 3),
            "peak / rank (MiB)": " / ".join(f"{v / MiB:.3f}" for v in peak.values()),
            "comm / step (KiB)": round(sum(e.bytes for e in comm) / max(steps, 1) / 1024, 1),
            "collectives / step": ", ".join(
                f"{op} ×{n / max(steps, 1):g}" for op, n in sorted(ops.items())
            ),
            "step (ms, median)": round(statistics.median(per_step.values()) / 1e6, 2)
            if per_step
            else None,
            "final loss": round(losses[-1], 6) if losses else None,
            "max |Δparam| vs single": check.get("max_param_diff"),
            "max |Δloss| vs single": check.get("max_loss_diff"),
        }


def _validation(result: StrategyResult, spec: RunSpec, world_size: int = 2) -> dict[str, Any]:
    """The planner's rows for rank 0 of this run: the preset model's placement under the
    strategy's layout (``run_plan.strategy_plan``) against what the tracer measured."""
    return validate(result.events, strategy_plan(spec, world_size), rank=0).as_dict()


def run_demo(
    *,
    model: str = "gpt-tiny",
    strategies: Sequence[str] = DEFAULT_STRATEGIES,
    steps: int = 4,
    batch_size: int = 8,
    log: Callable[[str], None] = print,
) -> list[StrategyResult]:
    """Run every strategy on a fresh 2-rank cluster; always stops the cluster."""
    results: list[StrategyResult] = []
    t0 = time.perf_counter()
    with Cluster(n=2) as cluster:
        log(f"cluster ready in {time.perf_counter() - t0:.1f} s: {cluster}")
        for strategy in strategies:
            spec = RunSpec(model=model, strategy=strategy, batch_size=batch_size)
            started = time.perf_counter()
            session = TrainingSession(cluster, spec)
            session.build()
            session.step(steps)
            result = StrategyResult(strategy=strategy, events=session.events)
            result.check = next(r for r in cluster.run(compare_with_reference) if r)
            result.validation = _validation(result, spec)
            session.close()
            result.seconds = time.perf_counter() - started
            log(
                f"{strategy:>9}: {steps} steps, max |Δparam| vs single "
                f"{result.check['max_param_diff']:.2e} ({result.seconds:.1f} s)"
            )
            results.append(result)
    return results


PLANNER_TEXT = (
    "The planner's per-rank memory for the same layout, against what the tracer "
    "measured on rank 0. The planner places the model's parameters with the same TP plan, "
    "split points and stage cuts the run applied (the Megatron teaching view: its MLP "
    "split, attention whole), so model state (weights, gradients, optimizer) is exact for "
    "every strategy, FSDP's padded shards and ZeRO-1's whole-parameter partition "
    "included; activations should be within 10%, each stage of a pipeline too. Optimizer "
    "step counters are bookkeeping and are recorded as 'other'."
)


def write_demo_report(
    results: list[StrategyResult],
    out: str | Path,
    *,
    steps: int,
    model: str,
    planner_text: str = PLANNER_TEXT,
    title: str = "workbench demo report",
    where: str = "2 local ranks (gloo on CPU)",
) -> Path:
    """The HTML report and one Perfetto trace per strategy under ``out``; returns the HTML path."""
    out_dir = Path(out)
    out_dir.mkdir(parents=True, exist_ok=True)
    table = [r.summary(steps) for r in results]
    planner_rows = _planner_rows(results)
    sections = [
        ReportSection(
            title="Every strategy, side by side",
            text=(
                f"The same model ({model}) trained for {steps} steps on {where} "
                "under each strategy, with the same global batch. Memory is "
                "measured from storages (parameters, gradients, optimizer state, activations "
                "saved for backward); collectives are every all-reduce, all-gather, "
                "reduce-scatter and point-to-point transfer the run issued. The last two "
                "columns compare the final parameters and the losses with a single-device run."
            ),
            table=table,
        ),
        ReportSection(
            title="Planner predictions next to measurements (rank 0)",
            text=planner_text,
            table=planner_rows,
        ),
    ]
    sections += [_strategy_section(r, out_dir) for r in results]
    return write_report(out_dir / "report.html", sections, title=title)


def _planner_rows(results: list[StrategyResult]) -> list[dict[str, Any]]:
    """One row per strategy and memory category: the planner's bytes next to the measured."""
    rows = []
    for r in results:
        for row in (r.validation or {}).get("rows", []):
            if row["unit"] != "bytes":
                continue
            rows.append(
                {
                    "strategy": r.strategy,
                    "category": row["category"],
                    "predicted (KiB)": round(row["predicted"] / 1024, 2),
                    "measured (KiB)": round(row["measured"] / 1024, 2),
                    "error": f"{row['error']:.1%}",
                    "verdict": "ok" if row["ok"] else "mismatch",
                }
            )
    return rows


def _strategy_section(r: StrategyResult, out_dir: Path) -> ReportSection:
    """One strategy's figures, with its Perfetto trace written beside the report."""
    ranks = sorted({e.rank for e in r.events}) or [0, 1]
    trace_path = out_dir / f"trace_{_file_name(r.strategy)}.json"
    to_perfetto(r.events, trace_path)
    return ReportSection(
        title=f"{r.strategy}",
        text=f"Perfetto trace: {trace_path.name} (open it in ui.perfetto.dev).",
        figures=[
            memory_figure(r.events, ranks=ranks),
            comm_timeline_figure(r.events, ranks=ranks),
            loss_figure(r.events),
        ],
    )


def _file_name(strategy: str) -> str:
    """A strategy label as a file name part ("dp=2 x tp=2" -> "dp2_x_tp2")."""
    return "".join(c if c.isalnum() or c in "-_" else "_" for c in strategy.replace("=", ""))


def format_table(rows: list[dict[str, Any]]) -> str:
    """A plain-text table for the terminal."""
    if not rows:
        return ""
    columns = list(rows[0])
    cells = [[_cell(row.get(c)) for c in columns] for row in rows]
    widths = [max(len(c), *(len(r[i]) for r in cells)) for i, c in enumerate(columns)]
    lines = ["  ".join(c.ljust(w) for c, w in zip(columns, widths, strict=True))]
    lines += ["  ".join(v.ljust(w) for v, w in zip(r, widths, strict=True)) for r in cells]
    return "\n".join(lines)


def _cell(value: Any) -> str:
    if value is None:
        return "-"
    if isinstance(value, float):
        return f"{value:.2e}" if 0 < abs(value) < 1e-3 else f"{value:g}"
    return str(value)
