"""``wb.compare``: the demo's side-by-side report, for the user's own model.

::

    result = wb.compare(model=make_model, data=make_data, loss=loss_fn, optimizer=make_opt,
                        strategies=["dp", "zero1", "fsdp", {"tp": 2}], tp_plan=plan,
                        out="reports/mine")
    print(result)          # the comparison table; result.report is the HTML path

Each strategy (a preset name, or a mapping of dimensions: ``{"dp": 2, "zero": 1}``) runs
the model for ``steps`` steps with tracing on the same global batch, is checked against the
single-device run, and is held against the planner's prediction from the model's parameter
count (counted on the meta device) when the model, data and optimizer are local objects.
The report is ``workbench.demo``'s: one table, the planner rows, and per strategy the
memory, communication and loss figures and a Perfetto trace.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from workbench import validate
from workbench.cluster import Cluster
from workbench.demo import StrategyResult, format_table, write_demo_report
from workbench.engine.equivalence import compare_user_with_reference
from workbench.errors import ConfigError, WorkbenchError, choices_error
from workbench.parallel.seeding import DEFAULT_SEED
from workbench.session.user_training import UserSpec, UserTrainingSession, user_spec
from workbench.trace.events import MemorySample

__all__ = ["USER_STRATEGIES", "StrategyComparison", "compare"]

USER_STRATEGIES: tuple[str, ...] = ("dp", "zero1", "fsdp", "pp")
_DIMS = ("dp", "tp", "pp", "zero", "overlap", "tp_plan", "pp_split")
# What else one entry may set, so a run with and without it stand side by side.
_RUN_OPTIONS = (
    "strategy",
    "checkpointing",
    "precision",
    "microbatches",
    "schedule",
    "stages_per_rank",
)

PLANNER_TEXT = (
    "The planner's per-rank memory for the same layout against what the tracer measured "
    "on rank 0. The planner places your model's parameters (counted on the meta device) with "
    "the same TP plan, split points and stage cuts the run applied, so model state "
    "(weights, gradients, optimizer) and data-parallel bytes are the tracer's to the byte "
    "for every layout: FSDP's padded shards, ZeRO-1's whole-parameter partition, the "
    "modules a TP plan leaves whole, what each pipeline stage holds. Activations come "
    "from the planner's transformer formula with the dimensions read from your model "
    "(within 10% for a transformer; wb.plan_from measures them instead)."
)


@dataclass(slots=True)
class StrategyComparison:
    """What ``compare`` ran: one ``StrategyResult`` per strategy, and the report."""

    model: str
    steps: int
    results: list[StrategyResult] = field(default_factory=list)
    report: Path | None = None
    notes: list[str] = field(default_factory=list)
    # each strategy's settings and the ranks it ran on: what ``workbench.export`` writes
    specs: list[tuple[UserSpec, int]] = field(default_factory=list)

    @property
    def table(self) -> list[dict[str, Any]]:
        """The demo's row per strategy, with rank 0's activation peak beside its step time
        (what checkpointing trades)."""
        rows = []
        for r in self.results:
            row = r.summary(self.steps)
            peak = max((s.activations for s in _rank0_memory(r)), default=0)
            rows.append({**row, "activations / rank (MiB)": round(peak / 2**20, 3)})
        return rows

    @property
    def max_param_diff(self) -> float:
        return max((r.check or {}).get("max_param_diff", 0.0) for r in self.results)

    def __str__(self) -> str:
        lines = [format_table(self.table)]
        lines.append(
            f"\nevery strategy against the single-device run: max |Δparam| = "
            f"{self.max_param_diff:.2e}"
        )
        lines += [f"note: {n}" for n in self.notes]
        if self.report is not None:
            lines.append(f"report: {self.report}")
        return "\n".join(lines)

    def __repr__(self) -> str:
        names = ", ".join(r.strategy for r in self.results)
        return f"<StrategyComparison {self.model}: {names}; report={self.report}>"


def _rank0_memory(result: StrategyResult) -> list[MemorySample]:
    return [e for e in result.events if isinstance(e, MemorySample) and e.rank == 0]


def _strategy_options(strategy: str | Mapping[str, Any]) -> tuple[str, dict[str, Any]]:
    """(preset name or 'custom', the dimension keywords) of one entry of ``strategies``."""
    if isinstance(strategy, str):
        if strategy in ("megatron", "single"):
            raise ConfigError(
                f"strategy {strategy!r} is not valid for your own model: 'megatron' is the "
                "built-in GPT's teaching view and 'single' is the reference every strategy "
                "is checked against; choose dp, zero1, zero2, fsdp, tp, pp, dp_tp or a "
                "mapping of dimensions"
            )
        return strategy, {}
    if isinstance(strategy, Mapping):
        validate.option_names("a strategy mapping", strategy, {*_DIMS, *_RUN_OPTIONS})
        if not strategy:
            raise ConfigError(
                f"strategy {dict(strategy)!r} is not valid; a mapping takes the dimensions "
                f"{list(_DIMS)} and the options {list(_RUN_OPTIONS)}, e.g. {{'dp': 2, "
                "'zero': 1}, {'strategy': 'fsdp', 'checkpointing': True}"
            )
        options = dict(strategy)
        preset = options.pop("strategy", "dp")
        if not isinstance(preset, str):
            raise choices_error("strategy", preset, USER_STRATEGIES)
        return _strategy_options(preset)[0], options  # a preset name, checked as above
    raise ConfigError(
        f"strategy {strategy!r} is not valid; give a preset name or a mapping of dimensions"
    )


def _specs(
    model: Any,
    strategies: Sequence[str | Mapping[str, Any]],
    common: dict[str, Any],
    world_size: int,
) -> list[UserSpec]:
    """Every strategy's spec, validated on the client before any engine works."""
    if isinstance(strategies, str) or not strategies:
        raise ConfigError(
            f"strategies={strategies!r} is not valid; give a list, e.g. ['dp', 'fsdp']"
        )
    specs = []
    for strategy in strategies:
        name, dims = _strategy_options(strategy)
        spec = user_spec(model, name, {**common, **dims})
        spec.validate(world_size)
        specs.append(spec)
    labels = [s.label(world_size) for s in specs]
    repeated = sorted({x for x in labels if labels.count(x) > 1})
    if repeated:
        raise ConfigError(f"strategies {repeated} are given twice; each strategy runs once")
    return specs


def _planner(
    model: Any, data: Any, optimizer: Any, notes: list[str]
) -> tuple[Any, int, str, Any] | None:
    """(ModelSpec, sequence length, optimizer name, the module on the meta device) when
    the objects are local."""
    if any(isinstance(x, str) for x in (model, data, optimizer)):
        notes.append(
            "the planner rows need the model, data and optimizer as local objects (a name "
            "looked up on the engines is not counted here)"
        )
        return None
    import torch

    from workbench.parallel.planning.measure import first_batch
    from workbench.parallel.planning.spec_from_model import (
        meta_model,
        planner_optimizer,
        user_model_spec,
    )

    try:
        spec = user_model_spec(model)
        module = meta_model(model)
        batch = first_batch(data, 1)
        inputs = batch[0] if isinstance(batch, tuple | list) else batch
        seq = int(inputs.shape[1]) if getattr(inputs, "dim", lambda: 0)() >= 2 else 1
        probe = [torch.nn.Parameter(torch.zeros(1))]
        name = planner_optimizer(optimizer(probe)) if optimizer is not None else "adamw"
    except ConfigError as exc:
        notes.append(f"no planner rows: {exc}")
        return None
    return spec, seq, name, module


def _validation(
    result: StrategyResult, spec: UserSpec, planned: tuple[Any, int, str, Any], world: int
) -> dict[str, Any]:
    from workbench.parallel.planning.run_plan import run_plan
    from workbench.parallel.planning.spec_from_model import planner_precision
    from workbench.planner import validate

    model, seq, optimizer, module = planned
    plan = run_plan(
        model,
        layout=spec.layout(world),
        world_size=world,
        batch_size=spec.batch_size,
        seq=seq,
        optimizer=optimizer,
        precision=planner_precision(spec.precision),
        grad_accum=spec.grad_accum,
        microbatches=spec.microbatches,
        schedule=spec.schedule,
        module=module,
        # Checkpointed blocks: the planner's full recompute, set beside the measurement.
        recompute="full" if spec.checkpointing is not False else "none",
    )
    return validate(result.events, plan, rank=0).as_dict()


def _checked_validation(
    result: StrategyResult,
    spec: UserSpec,
    planned: tuple[Any, int, str, Any],
    world: int,
    notes: list[str],
) -> dict[str, Any] | None:
    """The planner rows of one strategy; a layout the planner cannot model (e.g. tp on a
    model whose head count it could not read) is a note, not the end of the comparison
    whose runs already finished."""
    try:
        return _validation(result, spec, planned, world)
    except WorkbenchError as exc:
        notes.append(f"no planner rows for {result.strategy}: {exc}")
        return None


def compare(
    *,
    model: Any,
    data: Any,
    loss: Any,
    optimizer: Any = None,
    strategies: Sequence[str | Mapping[str, Any]] = USER_STRATEGIES,
    steps: int = 4,
    batch_size: int = 8,
    seed: int = DEFAULT_SEED,
    tp_plan: Mapping[str, Any] | None = None,
    pp_split: Sequence[str] | None = None,
    cluster: Cluster | None = None,
    out: str | Path | None = None,
    log: Callable[[str], None] = print,
    **unknown: Any,
) -> StrategyComparison:
    """Run the user's model under every strategy on ``cluster`` (default: a fresh 2-rank
    local one, always stopped) and write the demo's report to ``out`` when given."""
    validate.option_names("compare", unknown, _COMPARE_OPTIONS)  # a typo names the nearest
    if isinstance(steps, bool) or not isinstance(steps, int) or not 1 <= steps <= 10_000:
        raise ConfigError(f"steps={steps!r} is not valid; it must be an integer in 1..10000")
    common: dict[str, Any] = {
        "data": data,
        "loss": loss,
        "optimizer": optimizer,
        "batch_size": batch_size,
        "seed": seed,  # every strategy's run draws from it: run to run, the same numbers
    }
    if tp_plan is not None:
        common["tp_plan"] = tp_plan
    if pp_split is not None:
        common["pp_split"] = pp_split
    world = cluster.world_size if cluster is not None else 2
    specs = _specs(model, strategies, common, world)  # every error before any process
    outcome = StrategyComparison(model=specs[0].model, steps=steps)
    outcome.specs = [(spec, world) for spec in specs]
    planned = _planner(model, data, optimizer, outcome.notes)
    if cluster is None:
        with Cluster(n=2) as own:
            _run_all(own, specs, planned, outcome, log)
    else:
        _run_all(cluster, specs, planned, outcome, log)
    if out is not None:
        outcome.report = write_demo_report(
            outcome.results,
            out,
            steps=steps,
            model=outcome.model,
            planner_text=PLANNER_TEXT,
            title=f"workbench: {outcome.model} under every strategy",
            where=f"{world} ranks",
        )
    return outcome


_COMPARE_OPTIONS = (
    *("model", "data", "loss", "optimizer", "strategies", "steps", "batch_size", "seed"),
    *("tp_plan", "pp_split", "cluster", "out", "log"),
)


def _run_all(
    cluster: Cluster,
    specs: list[UserSpec],
    planned: tuple[Any, int, str, Any] | None,
    outcome: StrategyComparison,
    log: Callable[[str], None],
) -> None:
    world = cluster.world_size
    for spec in specs:
        label = spec.label(world)
        started = time.perf_counter()
        session = UserTrainingSession(cluster, spec)
        try:
            session.build()
            session.step(outcome.steps)
            result = StrategyResult(strategy=label, events=session.events)
            result.check = next(r for r in cluster.run(compare_user_with_reference) if r)
            if planned is not None:
                result.validation = _checked_validation(result, spec, planned, world, outcome.notes)
        finally:
            session.close()
        result.seconds = time.perf_counter() - started
        log(
            f"{label:>9}: {outcome.steps} steps, max |Δparam| vs single "
            f"{result.check['max_param_diff']:.2e} ({result.seconds:.1f} s)"
        )
        outcome.results.append(result)
