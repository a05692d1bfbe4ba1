"""Predicted vs measured: hold a plan against the events a real run recorded.

Events are ``workbench.trace`` objects (MemorySample, PhaseSpan, CommEvent) or their
``to_record`` dicts; nothing here imports torch. Model state must match to the byte, since
both sides count storages; activations within 10% (the planner's per-layer formula vs the
saved-tensor hooks); communication bytes within 1%; times are reported for information.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from workbench.planner.plan import Plan

__all__ = ["Comparison", "ValidationReport", "validate"]

# Sources of data-parallel traffic in the tracer's CommEvents: DDP's bucket all-reduces,
# FSDP's gathers and reduce-scatters, ZeroRedundancyOptimizer's parameter broadcasts and the
# workbench's own deferred gradient all-reduce (DDP with overlap off).
_DP_SOURCES = ("ddp-bucket", "fsdp", "zero", "workbench")


@dataclass(frozen=True, slots=True)
class Comparison:
    category: str
    predicted: float
    measured: float
    tolerance: float | None  # relative; None: shown for information, never fails
    unit: str = "bytes"

    @property
    def ratio(self) -> float:
        return self.measured / self.predicted if self.predicted else float("inf")

    @property
    def error(self) -> float:
        """Relative error of the prediction against the measurement."""
        if self.measured == self.predicted:
            return 0.0
        return abs(self.predicted - self.measured) / max(abs(self.measured), 1e-300)

    @property
    def ok(self) -> bool:
        return self.tolerance is None or self.error <= self.tolerance


@dataclass(frozen=True, slots=True)
class ValidationReport:
    rows: tuple[Comparison, ...]
    rank: int
    steps: tuple[int, ...]

    @property
    def ok(self) -> bool:
        return all(r.ok for r in self.rows)

    def row(self, category: str) -> Comparison:
        for r in self.rows:
            if r.category == category:
                return r
        raise KeyError(f"{category!r}; categories: {[r.category for r in self.rows]}")

    def as_dict(self) -> dict[str, Any]:
        return {
            "ok": self.ok,
            "rank": self.rank,
            "steps": list(self.steps),
            "rows": [
                {
                    "category": r.category,
                    "predicted": r.predicted,
                    "measured": r.measured,
                    "error": r.error,
                    "tolerance": r.tolerance,
                    "ok": r.ok,
                    "unit": r.unit,
                }
                for r in self.rows
            ],
        }

    def __str__(self) -> str:
        lines = [f"{'category':<22}{'predicted':>16}{'measured':>16}{'error':>9}  verdict"]
        for r in self.rows:
            tol = "info" if r.tolerance is None else f"<= {r.tolerance:.0%}"
            verdict = ("ok" if r.ok else "MISMATCH") + f" ({tol})"
            lines.append(
                f"{r.category:<22}{_fmt(r.predicted, r.unit):>16}{_fmt(r.measured, r.unit):>16}"
                f"{r.error:>9.1%}  {verdict}"
            )
        return "\n".join(lines)


def _fmt(value: float, unit: str) -> str:
    if unit == "s":
        return f"{value * 1e3:.2f} ms"
    return f"{value:,.0f}"


def _get(event: Any, name: str, default: Any = None) -> Any:
    if isinstance(event, dict):
        return event.get(name, default)
    return getattr(event, name, default)


def validate(
    events: Iterable[Any],
    plan: Plan,
    *,
    rank: int = 0,
    steps: Iterable[int] | None = None,
    activation_tol: float = 0.10,
    state_tol: float = 0.0,
    comm_bytes_tol: float = 0.01,
) -> ValidationReport:
    """Compare ``plan`` with what rank ``rank`` measured (over ``steps``, default all).

    Memory categories use the largest sample (optimizer state appears after the first
    step, activations peak at the end of the forward). Data-parallel bytes and seconds per
    step come from CommEvents of DDP buckets or FSDP; compute seconds from PhaseSpans.
    """
    wanted = set(steps) if steps is not None else None
    dp_run = plan.parallel.dp > 1  # otherwise "workbench" traffic is not data parallel
    measured = _measure(events, rank, wanted, dp_run)
    rows = _memory_rows(plan, rank, measured.mem, state_tol, activation_tol)
    rows += _time_rows(plan, rank, measured, comm_bytes_tol)
    return ValidationReport(rows=tuple(rows), rank=rank, steps=tuple(sorted(measured.seen)))


@dataclass(slots=True)
class _Measured:
    """What one rank recorded: peak memory by category, and per step the data-parallel
    bytes and seconds and the forward/backward seconds."""

    mem: dict[str, int] = field(default_factory=lambda: defaultdict(int))
    comm_bytes: dict[int, int] = field(default_factory=lambda: defaultdict(int))
    comm_secs: dict[int, float] = field(default_factory=lambda: defaultdict(float))
    phase_secs: dict[int, float] = field(default_factory=lambda: defaultdict(float))
    seen: set[int] = field(default_factory=set)


def _measure(events: Iterable[Any], rank: int, wanted: set[int] | None, dp_run: bool) -> _Measured:
    out = _Measured()
    for e in events:
        if _get(e, "rank") != rank:
            continue
        step = int(_get(e, "step", 0))
        if wanted is not None and step not in wanted:
            continue
        kind = _get(e, "kind")
        if kind == "memory":
            out.seen.add(step)
            for cat in ("params", "frozen", "grads", "optimizer", "activations"):
                out.mem[cat] = max(out.mem[cat], int(_get(e, cat, 0)))
        elif kind == "comm" and dp_run and _get(e, "source") in _DP_SOURCES:
            out.seen.add(step)
            out.comm_bytes[step] += int(_get(e, "bytes", 0))
            out.comm_secs[step] += max(int(_get(e, "end")) - int(_get(e, "start")), 1) / 1e9
        elif kind == "phase" and str(_get(e, "phase", "")).split("[")[0] in (
            "forward",
            "backward",
        ):
            out.seen.add(step)
            out.phase_secs[step] += (int(_get(e, "end")) - int(_get(e, "start"))) / 1e9
    return out


def _memory_rows(
    plan: Plan, rank: int, mem: dict[str, int], state_tol: float, activation_tol: float
) -> list[Comparison]:
    if not mem:
        return []
    m = plan.rank_memory(rank)  # this rank's stage and data-parallel share
    weights = mem["params"] + mem["frozen"]  # the planner's weights are frozen and trainable
    return [
        Comparison("weights", m.weights, weights, state_tol),
        Comparison("grads", m.grads, mem["grads"], state_tol),
        Comparison("optimizer", m.optimizer, mem["optimizer"], state_tol),
        Comparison(
            "model state",
            m.model_state,
            weights + mem["grads"] + mem["optimizer"],
            state_tol,
        ),
        Comparison("activations", m.activations, mem["activations"], activation_tol),
    ] + (
        # Frozen weights (a LoRA model's base), where the plan or the run has any.
        [Comparison("frozen weights", m.frozen, mem["frozen"], state_tol)]
        if m.frozen or mem["frozen"]
        else []
    )


def _time_rows(
    plan: Plan, rank: int, measured: _Measured, comm_bytes_tol: float
) -> list[Comparison]:
    rows: list[Comparison] = []
    comm_bytes, phase_secs = measured.comm_bytes, measured.phase_secs
    if comm_bytes:
        n = len(comm_bytes)
        rows.append(
            Comparison(
                "dp bytes/step",
                _dp_bytes(plan, rank),
                sum(comm_bytes.values()) / n,
                comm_bytes_tol,
            )
        )
        comm_s = sum(measured.comm_secs.values()) / n
        rows.append(Comparison("dp comm s/step", plan.time.dp_comm, comm_s, None, "s"))
    if phase_secs:
        n = len(phase_secs)
        compute = plan.time.compute + plan.time.bubble
        rows.append(Comparison("compute s/step", compute, sum(phase_secs.values()) / n, None, "s"))
    return rows


def _dp_bytes(plan: Plan, rank: int) -> float:
    """Bytes one rank hands to data-parallel collectives per step (buffer sizes, as the
    tracer records them: the gradient buffer for all-reduce / reduce-scatter, the
    gathered weights for all-gather; FSDP's padded to equal shards)."""
    from workbench.planner.memory import rank_position
    from workbench.planner.params import stage_params

    p, t = plan.parallel, plan.training
    if p.grad_group == 1:
        return 0.0
    if plan.placement is not None:
        stage = rank_position(p, rank)[0]
        grad_elements, n = plan.placement.collective_elements(stage, p.grad_group, p.zero)
        trainable = grad_elements * t.trainable
    else:
        layout = p.stage_layers(plan.model.layers)
        n = max(stage_params(plan.model, p.tp, layout, vocab_parallel=p.vocab_parallel))
        trainable = n * t.trainable
    grads = trainable * t.grad_comm_bytes
    weights = n * t.dtype_bytes
    m = plan.micro_batches
    syncs = 1 if t.grad_sync == "per_step" else m
    if p.zero == 0:
        return grads
    if p.zero == 1:
        return grads + trainable * t.dtype_bytes
    if p.zero == 2:
        return syncs * grads + trainable * t.dtype_bytes
    return m * 2 * weights + syncs * grads
