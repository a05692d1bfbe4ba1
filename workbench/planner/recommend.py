"""Pick a layout: among those that fit, the fastest; among near-ties, the simplest.

"Simplest" means least model parallelism (tp·pp), then the lowest ZeRO stage, then the
least recompute: each of those costs engineering effort or compute that buys nothing once
the plan already fits and runs as fast. TP stays inside a node. The reasons are written
out so a notebook or the CLI can show why, and what the alternatives would cost.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from workbench.errors import ConfigError
from workbench.planner.plan import Plan
from workbench.planner.specs import RECOMPUTE, HardwareSpec, ModelSpec, TrainingSpec
from workbench.planner.sweep import sweep
from workbench.planner.timing import StepTime

__all__ = ["Recommendation", "min_gpus", "recommend"]

_GB = 1e9
_TIE = 0.02  # throughputs within 2% count as equal


@dataclass(frozen=True, slots=True)
class Recommendation:
    best: Plan | None
    ranked: tuple[Plan, ...]  # plans that fit, fastest first
    considered: int
    reasons: tuple[str, ...] = field(default_factory=tuple)
    min_gpus: int | None = None

    def __str__(self) -> str:
        return "\n".join(self.reasons)


def _complexity(p: Plan) -> tuple[int, int, int, int]:
    return (
        p.parallel.tp * p.parallel.pp,
        p.parallel.pp,
        p.parallel.zero,
        RECOMPUTE.index(p.training.recompute),
    )


def _pick(plans: list[Plan]) -> Plan | None:
    fitting = [p for p in plans if p.fits]
    if not fitting:
        return None
    fastest = max(p.tokens_per_s for p in fitting)
    near = [p for p in fitting if p.tokens_per_s >= (1 - _TIE) * fastest]
    return min(near, key=lambda p: (_complexity(p), -p.tokens_per_s))


def _training_for(gpus: int, training: TrainingSpec | None) -> TrainingSpec:
    """A fixed global batch for a fair comparison: 4 micro-batches per GPU by default,
    which gives every pipeline at least 4·pp micro-batches."""
    t = training or TrainingSpec()
    if t.global_batch is None and t.grad_accum is None:
        t = t.with_(global_batch=4 * gpus * t.micro_batch)
    return t


def min_gpus(
    model: ModelSpec,
    hardware: HardwareSpec,
    training: TrainingSpec | None = None,
    *,
    limit: int = 4096,
) -> tuple[int, Plan] | None:
    """The smallest power-of-two GPU count on which some layout fits, and that layout."""
    n = 1
    while n <= limit:
        plans = sweep(
            model,
            hardware,
            _training_for(n, training),
            gpus=n,
            recompute=RECOMPUTE,
        )
        best = _pick(plans)
        if best is not None:
            return n, best
        n *= 2
    return None


def recommend(
    model: ModelSpec,
    hardware: HardwareSpec,
    gpus: int,
    training: TrainingSpec | None = None,
) -> Recommendation:
    """The recommended layout on ``gpus`` GPUs, with the reasons in words."""
    if isinstance(gpus, bool) or not isinstance(gpus, int) or gpus < 1:
        raise ConfigError(f"gpus={gpus!r} is not valid; it must be an integer >= 1")
    train = _training_for(gpus, training)
    plans = sweep(model, hardware, train, gpus=gpus, recompute=RECOMPUTE)
    if not plans:
        raise ConfigError(
            f"no valid layout of {gpus} GPUs for {model.name} (heads={model.heads}, "
            f"layers={model.layers}); try a GPU count that is a multiple of "
            f"{hardware.gpus_per_node} or a power of two"
        )
    best = _pick(plans)
    ranked = tuple(sorted((p for p in plans if p.fits), key=lambda p: -p.tokens_per_s))
    smallest = min_gpus(model, hardware, training, limit=max(gpus, 4096))
    reasons = _reasons(best, plans, ranked, gpus, hardware, smallest)
    return Recommendation(
        best=best,
        ranked=ranked,
        considered=len(plans),
        reasons=tuple(reasons),
        min_gpus=smallest[0] if smallest else None,
    )


def _gb(x: float) -> str:
    return f"{x / _GB:.1f} GB"


def _reasons(
    best: Plan | None,
    plans: list[Plan],
    ranked: tuple[Plan, ...],
    gpus: int,
    hw: HardwareSpec,
    smallest: tuple[int, Plan] | None,
) -> list[str]:
    name = plans[0].model.name
    where = f"{gpus}x {hw.name} ({max(1, -(-gpus // hw.gpus_per_node))} node(s))"
    if best is None:
        return _nothing_fits(name, where, plans, hw, smallest)
    t = best.time
    out = [
        f"Recommended for {name} on {where}: {best.layout()}.",
        f"Memory: {_gb(best.memory.total)} of {_gb(best.memory.capacity)} usable per GPU "
        f"(headroom {_gb(best.headroom)}).",
        f"Speed: {best.tokens_per_s:,.0f} tokens/s, step {t.total:.3g} s, "
        f"{t.efficiency:.0%} of the step computing, MFU {t.mfu:.0%}.",
        f"It is the fastest (within {_TIE:.0%}) and simplest of {len(ranked)} layouts that "
        f"fit, out of {len(plans)} considered; global batch {best.global_batch} samples.",
    ]
    out += _why_memory_savers(best, plans)
    out += _why_model_parallel(best, plans, hw)
    out += _where_time_goes(t, hw)
    if smallest is not None and smallest[0] < gpus:
        out.append(
            f"The cheapest setup that fits uses {smallest[0]} GPU(s) ({smallest[1].layout()}); "
            f"{gpus} GPUs buy speed, not feasibility."
        )
    out.extend(best.notes)
    return out


def _nothing_fits(
    name: str,
    where: str,
    plans: list[Plan],
    hw: HardwareSpec,
    smallest: tuple[int, Plan] | None,
) -> list[str]:
    frugal = min(plans, key=lambda p: p.memory.total)
    out = [
        f"Nothing fits for {name} on {where}: the most memory-frugal of "
        f"{len(plans)} layouts ({frugal.layout()}) needs {_gb(frugal.memory.total)} "
        f"per GPU, {_gb(hw.usable)} usable."
    ]
    if smallest is not None:
        out.append(f"It fits from {smallest[0]} GPUs ({smallest[1].layout()}).")
    else:
        out.append("No power-of-two GPU count up to 4096 fits; use a larger card.")
    return out


def _why_memory_savers(best: Plan, plans: list[Plan]) -> list[str]:
    """Why the chosen ZeRO stage and recompute are needed: the same tp/pp without them
    does not fit."""
    out = []
    p = best.parallel
    same = [q for q in plans if q.parallel.tp == p.tp and q.parallel.pp == p.pp]
    if p.zero:
        lower = [
            q
            for q in same
            if q.parallel.zero < p.zero and q.training.recompute == best.training.recompute
        ]
        if lower and not any(q.fits for q in lower):
            q = min(lower, key=lambda q: q.memory.total)
            out.append(
                f"ZeRO-{p.zero} is needed: ZeRO-{q.parallel.zero} would hold "
                f"{_gb(q.memory.model_state)} of model state ({_gb(q.memory.total)} in all)."
            )
    if best.training.recompute != "none":
        none = [q for q in same if q.parallel.zero == p.zero and q.training.recompute == "none"]
        if none and not none[0].fits:
            out.append(
                f"Recompute '{best.training.recompute}' is needed: without it activations "
                f"take {_gb(none[0].memory.activations)} per GPU."
            )
    return out


def _why_model_parallel(best: Plan, plans: list[Plan], hw: HardwareSpec) -> list[str]:
    """Why tp·pp > 1 (pure data parallelism does not fit, or is slower), and where TP runs."""
    out = []
    p = best.parallel
    if p.tp * p.pp > 1:
        pure = [q for q in plans if q.parallel.tp * q.parallel.pp == 1]
        if pure and not any(q.fits for q in pure):
            q = min(pure, key=lambda q: q.memory.total)
            out.append(
                f"Model parallelism (tp={p.tp}, pp={p.pp}) is needed: the best pure "
                f"data-parallel layout needs {_gb(q.memory.total)} per GPU."
            )
        elif pure:
            q = max((q for q in pure if q.fits), key=lambda q: q.tokens_per_s)
            out.append(
                f"Pure data parallelism fits but is {1 - q.tokens_per_s / best.tokens_per_s:.0%} "
                "slower."
            )
    if p.tp > 1:
        out.append(
            f"TP={p.tp} stays inside a node ({hw.gpus_per_node} GPUs/node, {hw.intra.name})."
        )
    return out


def _where_time_goes(t: StepTime, hw: HardwareSpec) -> list[str]:
    """The step's exposed communication (and its largest part) and pipeline bubble."""
    out = []
    if t.comm_exposed > 0.01 * t.total:
        parts = [
            (
                t.dp_exposed,
                f"data-parallel sync over {hw.inter.name if t.dp_inter else hw.intra.name}",
            ),
            (t.tp_comm, "TP all-reduces"),
            (t.pp_comm, "pipeline sends"),
        ]
        worst = max(parts, key=lambda x: x[0])
        out.append(
            f"Exposed communication is {t.comm_exposed / t.total:.0%} of the step, mostly "
            f"{worst[1]}."
        )
    if t.bubble > 0:
        out.append(f"Pipeline bubble: {t.bubble / t.total:.0%} of the step.")
    return out
