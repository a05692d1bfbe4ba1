"""One plan: a model, a training step, a layout and hardware -> memory, time, verdict."""

from __future__ import annotations

import math
from dataclasses import dataclass, fields
from typing import Any

from workbench import validate
from workbench.errors import ConfigError, ParallelError
from workbench.planner.comm import spans_nodes
from workbench.planner.memory import MemoryBreakdown, memory_breakdown
from workbench.planner.placement import Placement
from workbench.planner.presets import hardware_preset, model_preset
from workbench.planner.specs import HardwareSpec, ModelSpec, ParallelSpec, TrainingSpec
from workbench.planner.timing import StepTime, step_time

__all__ = ["Plan", "check_layout", "evaluate", "plan", "resolve_batch"]

_GB = 1e9


@dataclass(frozen=True, slots=True)
class Plan:
    """What one configuration costs per GPU and per step."""

    model: ModelSpec
    training: TrainingSpec
    parallel: ParallelSpec
    hardware: HardwareSpec
    seq: int
    micro_batches: int
    global_batch: int
    memory: MemoryBreakdown
    time: StepTime
    notes: tuple[str, ...] = ()
    # The parameters each stage holds as built (None: derived from the dimensions).
    placement: Placement | None = None
    activation_scale: tuple[float, float] = (1.0, 1.0)

    def rank_memory(self, rank: int) -> MemoryBreakdown:
        """Bytes on global ``rank`` (its pipeline stage and data-parallel index), where
        ``memory`` is the most loaded rank's."""
        return memory_breakdown(
            self.model,
            self.training,
            self.parallel,
            self.hardware,
            seq=self.seq,
            micro_batches=self.micro_batches,
            activation_scale=self.activation_scale,
            placement=self.placement,
            rank=rank,
        )

    @property
    def fits(self) -> bool:
        return self.memory.fits

    @property
    def headroom(self) -> int:
        return self.memory.headroom

    @property
    def tokens_per_s(self) -> float:
        return self.time.tokens_per_s

    @property
    def gpus(self) -> int:
        return self.parallel.world

    @property
    def nodes(self) -> int:
        return math.ceil(self.parallel.world / self.hardware.gpus_per_node)

    @property
    def verdict(self) -> str:
        m = self.memory
        if m.fits:
            return f"fits: {m.total / _GB:.1f} GB of {m.capacity / _GB:.1f} GB usable"
        return (
            f"OOM: needs {m.total / _GB:.1f} GB, {m.capacity / _GB:.1f} GB usable "
            f"(short by {-m.headroom / _GB:.1f} GB)"
        )

    def layout(self) -> str:
        p = self.parallel
        parts = [f"dp={p.dp}", f"tp={p.tp}", f"pp={p.pp}", f"zero={p.zero}"]
        if p.cp > 1:
            parts.insert(3, f"cp={p.cp}")
        if p.sequence_parallel:
            parts.append("sp")
        if p.first_stage_layers or p.last_stage_layers:
            stages = p.stage_layers(self.model.layers)
            parts.append(f"stages={stages[0]}/{max(stages[1:-1], default='-')}/{stages[-1]}")
        if p.virtual_stages > 1:
            parts.append(f"v={p.virtual_stages}")
        parts.append(f"recompute={self.training.recompute}")
        parts.append(f"mb={self.training.micro_batch}x{self.micro_batches}")
        return " ".join(parts)

    def to_dict(self) -> dict[str, Any]:
        return {
            "model": {
                "name": self.model.name,
                "params": self.model.n_params,
                "layers": self.model.layers,
                "hidden": self.model.hidden,
                "heads": self.model.heads,
                "shape_assumed": self.model.shape_assumed,
            },
            "training": _fields(self.training),
            "parallel": _fields(self.parallel),
            "hardware": self.hardware.to_dict(),
            "gpus": self.gpus,
            "nodes": self.nodes,
            "seq": self.seq,
            "micro_batches": self.micro_batches,
            "global_batch": self.global_batch,
            "memory": self.memory.as_dict(),
            "time": self.time.as_dict(),
            "fits": self.fits,
            "verdict": self.verdict,
            "notes": list(self.notes),
        }


def _fields(spec: Any) -> dict[str, Any]:
    return {f.name: getattr(spec, f.name) for f in fields(spec)}


def check_layout(
    model: ModelSpec, parallel: ParallelSpec, placement: Placement | None = None
) -> None:
    """Raise ParallelError when the layout cannot split this model (a placement's chunks
    say themselves how each stage's blocks fill its virtual stages)."""
    tp, pp = parallel.tp, parallel.pp
    kv = model.kv_heads or model.heads
    if model.heads % tp or kv % tp:
        valid = [
            d for d in range(1, math.gcd(model.heads, kv) + 1) if math.gcd(model.heads, kv) % d == 0
        ]
        raise ParallelError(
            f"tp={tp} does not divide heads={model.heads} (kv_heads={kv}); valid tp: {valid}"
        )
    v = parallel.virtual_stages
    if placement is not None and placement.chunks is not None:
        if len(placement.chunks[0]) != v:
            raise ParallelError(
                f"the placement has {len(placement.chunks[0])} virtual chunks per stage but "
                f"virtual_stages={v}"
            )
        return
    if v > model.layers:
        raise ParallelError(
            f"virtual_stages={v} is more model chunks than layers={model.layers}; "
            f"valid virtual_stages: 1..{model.layers}"
        )
    if pp * v > model.layers:
        raise ParallelError(
            f"pp={pp} (x virtual_stages={v}) is more stages than "
            f"layers={model.layers}; valid pp: 1..{model.layers // v}"
        )
    stages = parallel.stage_layers(model.layers)  # raises on an impossible uneven split
    if min(stages) < v:
        raise ParallelError(
            f"virtual_stages={v} needs at least {v} layers on every stage; the stages "
            f"have {min(stages)}..{max(stages)}"
        )


def resolve_batch(training: TrainingSpec, parallel: ParallelSpec) -> tuple[int, int]:
    """(micro-batches per step per replica, global batch in samples)."""
    per_pass = training.micro_batch * parallel.dp
    given = {
        k: v
        for k, v in (("grad_accum", training.grad_accum), ("micro_batches", parallel.micro_batches))
        if v is not None
    }
    if len(set(given.values())) > 1:
        raise ConfigError(
            f"grad_accum={training.grad_accum} and micro_batches={parallel.micro_batches} "
            "disagree; they are the same count, give one"
        )
    if training.global_batch is not None:
        if training.global_batch % per_pass:
            raise ConfigError(
                f"global_batch={training.global_batch} is not a multiple of "
                f"micro_batch·dp={training.micro_batch}·{parallel.dp}={per_pass}"
            )
        m = training.global_batch // per_pass
        if given and next(iter(given.values())) != m:
            raise ConfigError(
                f"global_batch={training.global_batch} means {m} micro-batches per replica, "
                f"but {next(iter(given))}={next(iter(given.values()))} was given"
            )
        return m, training.global_batch
    m = next(iter(given.values())) if given else 1
    return m, m * per_pass


def evaluate(
    model: ModelSpec,
    training: TrainingSpec,
    parallel: ParallelSpec,
    hardware: HardwareSpec,
    *,
    activation_scale: tuple[float, float] = (1.0, 1.0),
    placement: Placement | None = None,
) -> Plan:
    """The plan for one fully specified configuration (the pure core of ``plan``).
    ``activation_scale``: measured / formula activation bytes (layers, embedding + head);
    ``placement``: the parameters each pipeline stage holds as built (model state from
    its pieces instead of the dimensions)."""
    _check_placement(parallel, placement)
    check_layout(model, parallel, placement)
    seq = training.seq or model.seq
    if seq is None:
        raise ConfigError("no sequence length: give training seq=<tokens> or model seq=<tokens>")
    _check_scale(activation_scale)
    m, global_batch = resolve_batch(training, parallel)
    memory = memory_breakdown(
        model,
        training,
        parallel,
        hardware,
        seq=seq,
        micro_batches=m,
        activation_scale=activation_scale,
        placement=placement,
    )
    time = step_time(model, training, parallel, hardware, seq=seq, micro_batches=m)
    notes = _notes(model, training, parallel, hardware, memory, m)
    return Plan(
        model=model,
        training=training,
        parallel=parallel,
        hardware=hardware,
        seq=seq,
        micro_batches=m,
        global_batch=global_batch,
        memory=memory,
        time=time,
        notes=notes,
        placement=placement,
        activation_scale=activation_scale,
    )


def _check_placement(parallel: ParallelSpec, placement: Placement | None) -> None:
    if placement is None:
        return
    if not isinstance(placement, Placement):
        raise ConfigError(f"placement={placement!r} is not valid; give a planner Placement")
    if placement.pp != parallel.pp:
        raise ParallelError(
            f"the placement has {placement.pp} pipeline stage(s) but the layout pp={parallel.pp}"
        )


def _check_scale(activation_scale: tuple[float, float]) -> None:
    for factor in activation_scale:
        if (
            isinstance(factor, bool)
            or not isinstance(factor, int | float)
            or not (0 <= factor < 1e6)
        ):
            raise ConfigError(
                f"activation_scale={activation_scale!r} is not valid; give two finite "
                "factors >= 0 (layers, embedding + head)"
            )


def _notes(
    model: ModelSpec,
    training: TrainingSpec,
    parallel: ParallelSpec,
    hardware: HardwareSpec,
    memory: MemoryBreakdown,
    m: int,
) -> tuple[str, ...]:
    """What a reader of the plan should know: assumptions and likely fixes."""
    notes: list[str] = []
    if model.shape_assumed:
        notes.append(
            f"shape assumed from the parameter count: {model.layers} layers, hidden "
            f"{model.hidden}, {model.heads} heads (give dimensions for exact activations)"
        )
    if spans_nodes(parallel.tp, 1, hardware.gpus_per_node):
        notes.append(
            f"TP group of {parallel.tp} spans nodes ({hardware.gpus_per_node} GPUs/node): its "
            "per-layer all-reduces run over the inter-node link"
        )
    if parallel.pp > 1 and m < parallel.pp:
        notes.append(
            f"only {m} micro-batches for {parallel.pp} pipeline stages: bubble "
            f"{(parallel.pp - 1) / m:.0%} of compute; use >= {4 * parallel.pp}"
        )
    if not memory.fits and training.recompute == "none" and memory.activations > memory.model_state:
        notes.append(
            "activations dominate: recompute='selective' (or FlashAttention) drops the "
            "attention-score term, recompute='full' keeps only each layer's input"
        )
    return tuple(notes)


_TRAINING_KEYS = frozenset(f.name for f in fields(TrainingSpec))
_PARALLEL_KEYS = frozenset(f.name for f in fields(ParallelSpec))


def plan(
    model: ModelSpec | str | None = None,
    hardware: HardwareSpec | str = "a100-80gb",
    *,
    params: float | None = None,
    gpus: int | None = None,
    training: TrainingSpec | None = None,
    parallel: ParallelSpec | None = None,
    **settings: Any,
) -> Plan:
    """Plan a configuration from names or specs.

    ``plan("llama2-7b", "a100-80gb", gpus=8, zero=3, precision="bf16-mixed")``;
    ``plan(params=10e9, hardware="h100-80gb", gpus=16, tp=8)``. Keyword settings are
    fields of ``TrainingSpec`` (micro_batch, seq, precision, optimizer, recompute, mfu, ...)
    or ``ParallelSpec`` (dp, tp, pp, zero, sequence_parallel, ...). With ``gpus`` and no
    ``dp``, dp = gpus / (tp·pp).
    """
    valid = _TRAINING_KEYS | _PARALLEL_KEYS | {"gpus", "params", "training", "parallel"}
    validate.option_names("plan", settings, valid)
    spec = _model(model, params)
    hw = hardware_preset(hardware) if isinstance(hardware, str) else hardware
    t_set = {k: v for k, v in settings.items() if k in _TRAINING_KEYS}
    p_set = {k: v for k, v in settings.items() if k in _PARALLEL_KEYS}
    train = training.with_(**t_set) if training is not None else TrainingSpec(**t_set)
    base = parallel.with_(**p_set) if parallel is not None else None
    if gpus is not None:
        if isinstance(gpus, bool) or not isinstance(gpus, int) or gpus < 1:
            raise ConfigError(f"gpus={gpus!r} is not valid; it must be an integer >= 1")
        tp = p_set.get("tp", base.tp if base else 1)
        pp = p_set.get("pp", base.pp if base else 1)
        cp = p_set.get("cp", base.cp if base else 1)
        if "dp" not in p_set and (base is None or parallel is None):
            if gpus % (tp * pp * cp):
                raise ParallelError(
                    f"gpus={gpus} is not divisible by tp·pp·cp={tp}·{pp}·{cp}={tp * pp * cp}"
                )
            p_set["dp"] = gpus // (tp * pp * cp)
    layout = base.with_(**p_set) if base is not None and p_set else base
    if layout is None:
        layout = ParallelSpec(**p_set)
    if gpus is not None and layout.world != gpus:
        raise ParallelError(
            f"gpus={gpus} but dp·tp·pp·cp={layout.dp}·{layout.tp}·{layout.pp}·{layout.cp}"
            f"={layout.world}"
        )
    return evaluate(spec, train, layout, hw)


def _model(model: ModelSpec | str | None, params: float | None) -> ModelSpec:
    if isinstance(model, ModelSpec):
        return model if params is None else model.with_(params=_count(params))
    if isinstance(model, str):
        spec = model_preset(model)
        return spec if params is None else spec.with_(params=_count(params))
    if params is None:
        raise ConfigError("give model=<preset name or ModelSpec> or params=<count>")
    count = _count(params)
    return ModelSpec(name=f"{count / 1e9:g}B", params=count, vocab=32000, seq=2048)


def _count(params: float) -> int:
    if isinstance(params, bool) or not isinstance(params, int | float) or not params >= 1:
        raise ConfigError(f"params={params!r} is not valid; it must be a count >= 1")
    return round(params)
