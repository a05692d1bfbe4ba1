"""Evaluate many configurations at once: the grid behind scaling curves and recommendations.

Each configuration is a handful of multiplications (tens of microseconds), so a Python
loop over ``evaluate`` does tens of thousands per second; ``benchmarks/planner_sweep.py``
measures the rate.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass

from workbench.errors import ConfigError
from workbench.planner.plan import Plan, evaluate
from workbench.planner.specs import HardwareSpec, ModelSpec, ParallelSpec, TrainingSpec

__all__ = ["ScalingPoint", "layouts", "scaling", "sweep"]


def _seq(value: object) -> tuple:
    if isinstance(value, str | int | bool) or not isinstance(value, Iterable):
        return (value,)
    return tuple(value)


def layouts(
    gpus: int,
    model: ModelSpec,
    hardware: HardwareSpec,
    *,
    zero: Iterable[int] = (0, 1, 2, 3),
    tp: Iterable[int] | None = None,
    pp: Iterable[int] | None = None,
    tp_inside_node: bool = True,
) -> Iterator[ParallelSpec]:
    """Valid dp×tp×pp layouts of exactly ``gpus`` GPUs for this model.

    TP divides the heads (and KV heads) and, with ``tp_inside_node``, stays within a node;
    PP divides the layers (balanced stages); sequence parallel is on whenever tp > 1; ZeRO
    stages other than 0 only where dp > 1.
    """
    kv = model.kv_heads or model.heads
    tps = tuple(tp) if tp is not None else _divisors(gpus)
    pps = tuple(pp) if pp is not None else _divisors(gpus)
    for t in tps:
        if gpus % t or model.heads % t or kv % t:
            continue
        if tp_inside_node and t > hardware.gpus_per_node:
            continue
        for p in pps:
            if (gpus // t) % p or model.layers % p:
                continue
            dp = gpus // (t * p)
            for z in zero:
                if z and dp == 1:
                    continue
                yield ParallelSpec(dp=dp, tp=t, pp=p, zero=z, sequence_parallel=t > 1)


def _divisors(n: int) -> tuple[int, ...]:
    return tuple(d for d in range(1, n + 1) if n % d == 0)


def sweep(
    model: ModelSpec | Sequence[ModelSpec],
    hardware: HardwareSpec | Sequence[HardwareSpec],
    training: TrainingSpec | Sequence[TrainingSpec] | None = None,
    *,
    gpus: int | Iterable[int] = (1, 2, 4, 8),
    zero: Iterable[int] = (0, 1, 2, 3),
    tp: Iterable[int] | None = None,
    pp: Iterable[int] | None = None,
    recompute: Iterable[str] | None = None,
    micro_batch: Iterable[int] | None = None,
    tp_inside_node: bool = True,
) -> list[Plan]:
    """Plans for the product of the axes (invalid combinations are skipped).

    ``model``, ``hardware`` and ``training`` may each be one spec or a sequence;
    ``recompute`` and ``micro_batch`` override the training spec's values.
    """
    trainings = _seq(training if training is not None else TrainingSpec())
    variants = [
        t.with_(**_changes(t, r, b))
        for t in trainings
        for r in (_seq(recompute) if recompute is not None else (t.recompute,))
        for b in (_seq(micro_batch) if micro_batch is not None else (t.micro_batch,))
    ]
    zeros = tuple(zero)
    out: list[Plan] = []
    for m, hw, n in itertools.product(_seq(model), _seq(hardware), _seq(gpus)):
        for layout in layouts(n, m, hw, zero=zeros, tp=tp, pp=pp, tp_inside_node=tp_inside_node):
            for t in variants:
                try:
                    out.append(evaluate(m, t, layout, hw))
                except ConfigError:
                    continue  # e.g. a global batch this layout cannot divide
    return out


def _changes(t: TrainingSpec, recompute: str, micro_batch: int) -> dict[str, object]:
    changes: dict[str, object] = {}
    if recompute != t.recompute:
        changes["recompute"] = recompute
    if micro_batch != t.micro_batch:
        changes["micro_batch"] = micro_batch
    return changes


@dataclass(frozen=True, slots=True)
class ScalingPoint:
    """Throughput at one GPU count; ``efficiency`` is relative to linear scaling of the
    first point, ``compute_fraction`` the share of the step spent computing."""

    gpus: int
    nodes: int
    tokens_per_s: float
    step_s: float
    efficiency: float
    compute_fraction: float
    fits: bool
    plan: Plan


def scaling(
    model: ModelSpec,
    hardware: HardwareSpec,
    training: TrainingSpec | None = None,
    *,
    gpus: Iterable[int] = (1, 2, 4, 8, 16, 32, 64, 128),
    tp: int = 1,
    pp: int = 1,
    zero: int = 0,
) -> list[ScalingPoint]:
    """Data-parallel scaling at a fixed tp×pp block (weak scaling: the per-replica batch
    stays, so the global batch grows with dp; a fixed ``global_batch`` gives strong
    scaling and skips GPU counts it cannot divide)."""
    train = training or TrainingSpec()
    points: list[ScalingPoint] = []
    base: float | None = None
    for n in gpus:
        if n % (tp * pp):
            continue
        dp = n // (tp * pp)
        layout = ParallelSpec(
            dp=dp, tp=tp, pp=pp, zero=zero if dp > 1 else 0, sequence_parallel=tp > 1
        )
        try:
            p = evaluate(model, train, layout, hardware)
        except ConfigError:
            continue
        per_gpu = p.tokens_per_s / n
        if base is None:
            base = per_gpu
        points.append(
            ScalingPoint(
                gpus=n,
                nodes=p.nodes,
                tokens_per_s=p.tokens_per_s,
                step_s=p.time.total,
                efficiency=per_gpu / base,
                compute_fraction=p.time.efficiency,
                fits=p.fits,
                plan=p,
            )
        )
    return points
