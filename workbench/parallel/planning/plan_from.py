"""``wb.plan_from``: plan the user's own model at cluster scale from a small measurement.

::

    wb.plan_from(make_model, data=make_data, loss=loss_fn,
                 gpus=64, gpu="h100-80gb", tp=8, zero=3, seq_len=4096)

1. Counted: the parameters, on the meta device (``model_spec.user_model_spec``), and the
   dimensions the model states (config, blocks, embedding, attention).
2. Measured: one traced forward (+ loss) at small scale on this process's CPU
   (``measure.measure_activations``): activation bytes per token per layer and at the
   edges, and whether they grow with the sequence (an s x s attention tensor).
3. Extrapolated: the planner's formulas, scaled by measured / formula bytes at the
   measured size, give activations on the target (its sequence, micro-batch, TP split,
   precision, recompute); model state is the planner's arithmetic on the model's own
   parameters placed by the target layout (``placement.module_placement``: the TP plan,
   split points and stage cuts the workbench would apply, FSDP padding and ZeRO-1's
   partition included; from the count alone when the layout cannot be placed); step
   time is the planner's estimate (nothing about a GPU's speed is measured on a CPU).
   The result's ``rows`` say which number is which.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn

from workbench.errors import ConfigError, WorkbenchError
from workbench.parallel.parallelize import Layout
from workbench.parallel.placement import module_placement
from workbench.parallel.planning.measure import (
    ActivationMeasurement,
    first_batch,
    measure_activations,
)
from workbench.parallel.planning.run_plan import LOCAL_CPU
from workbench.parallel.planning.spec_from_model import meta_model, read_shape, user_model_spec
from workbench.planner import HardwareSpec, ParallelSpec, Plan, TrainingSpec, evaluate, plan
from workbench.planner.memory import activation_bytes
from workbench.planner.placement import Placement

__all__ = ["MeasuredPlan", "plan_from"]

# Largest model (parameter bytes in fp32) built for real to measure on this process.
_MEASURE_LIMIT = 4 * 2**30


@dataclass(frozen=True, slots=True)
class MeasuredPlan:
    """The plan on the target, and how each of its numbers was obtained."""

    plan: Plan
    formula_plan: Plan  # the same without the measurement (the planner's formula alone)
    measurement: ActivationMeasurement
    scale: tuple[float, float]  # measured / formula bytes: (per layer, embedding + head)
    shape_sources: dict[str, str] = field(default_factory=dict)
    notes: tuple[str, ...] = ()
    placed: bool = False  # model state from the parameters as the layout places them

    @property
    def fits(self) -> bool:
        return self.plan.fits

    @property
    def verdict(self) -> str:
        return self.plan.verdict

    @property
    def rows(self) -> list[dict[str, Any]]:
        """Every number with its value and how it was obtained: counted, measured or
        extrapolated."""
        p, m, x = self.plan, self.plan.memory, self.measurement
        t = p.time
        small = f"1 traced forward on CPU, batch {x.batch} x seq {x.seq}"
        state = (
            "counted: the model's parameters as the layout places them"
            if self.placed
            else "extrapolated: planner arithmetic on the count"
        )
        rows = [
            _row("parameters", p.model.n_params, "", "counted on the meta device"),
            _row(
                "activations / token / layer (small run)",
                x.layer_bytes_per_token,
                "B",
                f"measured: {small}",
            ),
            _row("activations at the edges (small run)", x.edge_bytes, "B", f"measured: {small}"),
            _row(
                "keeps an s x s attention tensor",
                {True: "yes", False: "no", None: "not measured"}[x.stores_scores],
                "",
                "measured: bytes per token at seq and seq/2"
                if x.stores_scores is not None
                else "assumed by the planner's formula (no sequence to halve)",
            ),
            _row("weights / GPU", m.weights, "B", state),
            _row("grads / GPU", m.grads, "B", state),
            _row("optimizer / GPU", m.optimizer, "B", state),
            _row(
                "activations / GPU",
                m.activations,
                "B",
                f"extrapolated: planner formula x measured/formula "
                f"({self.scale[0]:.3f} layers, {self.scale[1]:.3f} edges)",
            ),
            _row("temporary buffers / GPU", m.temporary, "B", "extrapolated: planner arithmetic"),
            _row("total / GPU", m.total, "B", "extrapolated"),
            _row("fits", "yes" if p.fits else "OOM", "", p.verdict),
            _row(
                "step time",
                t.total,
                "s",
                "extrapolated: planner estimate ("
                + (
                    f"compute efficiency {p.training.mfu:g}"
                    if p.training.mfu is not None
                    else "per-operation efficiency model"
                )
                + " assumed, links from the hardware preset)",
            ),
            _row("tokens / s", t.tokens_per_s, "", "extrapolated: planner estimate"),
        ]
        return rows

    def __str__(self) -> str:
        lines = [f"{self.plan.model.name} on {self.plan.gpus} x {self.plan.hardware.name}: "
                 f"{self.plan.layout()}", self.verdict]  # fmt: skip
        width = max(len(r["quantity"]) for r in self.rows)
        for r in self.rows:
            lines.append(f"  {r['quantity']:<{width}}  {r['shown']:>14}  {r['how']}")
        lines += [f"  note: {n}" for n in (*self.notes, *self.plan.notes)]
        return "\n".join(lines)

    def __repr__(self) -> str:
        return (
            f"<MeasuredPlan {self.plan.model.name} {self.plan.layout()} on {self.plan.gpus} x "
            f"{self.plan.hardware.name}: {self.verdict}>"
        )


def _bytes(value: float) -> str:
    for unit, size in (("GB", 1e9), ("MB", 1e6), ("kB", 1e3)):
        if abs(value) >= size:
            return f"{value / size:,.2f} {unit}"
    return f"{value:,.0f} B"


def _row(quantity: str, value: Any, unit: str, how: str) -> dict[str, Any]:
    if unit == "B":
        shown = _bytes(value)
    elif unit == "s":
        shown = f"{value * 1e3:,.1f} ms"
    elif isinstance(value, float):
        shown = f"{value:,.0f}"
    elif isinstance(value, int):
        shown = f"{value:,}"
    else:
        shown = str(value)
    return {"quantity": quantity, "value": value, "unit": unit, "shown": shown, "how": how}


def _measured_model(model: Any, measure_with: Any, n_params: int, seed: int) -> nn.Module:
    source = measure_with if measure_with is not None else model
    if isinstance(source, nn.Module):
        if any(p.device.type == "meta" for p in source.parameters()):
            raise ConfigError(
                "the model is on the meta device: give measure_with= a factory (or module) "
                "that builds it with real weights, e.g. the same model with fewer layers"
            )
        return source
    if measure_with is None and n_params * 4 > _MEASURE_LIMIT:
        raise ConfigError(
            f"the model has {n_params:,} parameters, too many to build on this process to "
            "measure one step; give measure_with= the same architecture with fewer layers "
            "(bytes per layer do not depend on the layer count)"
        )
    if not callable(source):
        raise ConfigError(f"measure_with={source!r} is not valid; give a module or a factory")
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        built = source()
    if not isinstance(built, nn.Module):
        raise ConfigError(f"the model factory returned {type(built).__name__}, not an nn.Module")
    return built


def _scale(small: nn.Module, x: ActivationMeasurement) -> tuple[tuple[float, float], str]:
    """Measured / formula bytes at the measured size (the formula for the measured model)."""
    spec = user_model_spec(small, seq=x.seq)
    training = TrainingSpec(
        micro_batch=x.batch,
        seq=x.seq,
        precision="fp32" if x.dtype_bytes == 4 else "bf16-mixed",
        dropout=x.dropout,
        flash_attention=x.stores_scores is False,
    )
    layers, edge = activation_bytes(
        spec, training, ParallelSpec(), LOCAL_CPU, seq=x.seq, micro_batches=1
    )
    per_layer = layers / spec.layers
    note = ""
    if spec.shape_assumed:
        note = (
            "the model does not state layers / hidden / heads: the formula uses a shape "
            "assumed from the parameter count, anchored by the measurement"
        )
    return (x.layer_bytes / per_layer, x.edge_bytes / edge if edge else 1.0), note


def plan_from(
    model: nn.Module | Callable[[], Any],
    *,
    sample: Any = None,
    data: Any = None,
    loss: Callable[[Any, Any], torch.Tensor] | None = None,
    measure_with: nn.Module | Callable[[], Any] | None = None,
    batch_size: int = 2,
    gpus: int | None = None,
    gpu: str | HardwareSpec = "h100-80gb",
    seq_len: int | None = None,
    seed: int = 0,
    tp_plan: Any = None,
    pp_split: Any = None,
    **settings: Any,
) -> MeasuredPlan:
    """Plan ``model`` on a target cluster from its counted parameters and one small traced
    forward (see the module docstring). ``sample`` (inputs or (inputs, targets)) or
    ``data`` (as ``Stepper(data=...)``: the first ``batch_size`` samples) feed the forward;
    ``loss`` is included when given. ``settings`` are the planner's (tp=, pp=, dp=, zero=,
    micro_batch=, precision=, optimizer=, recompute=, flash_attention=, ...); ``tp_plan`` /
    ``pp_split`` as for a run's ``Layout`` (default: the model's own)."""
    _check_inputs(sample, data, batch_size, seq_len)
    spec = user_model_spec(model, seq=seq_len, seed=seed)
    module = meta_model(model, seed=seed)
    shape_sources = dict(read_shape(module).sources)
    small = _measured_model(model, measure_with, spec.n_params, seed)
    batch = sample if sample is not None else first_batch(data, batch_size)
    small.train()
    x = measure_activations(small, batch, loss=loss)
    scale, note = _scale(small, x)
    notes = [note] if note else []
    if seq_len is None:
        notes.append(f"seq_len not given: planned at the measured sequence length {x.seq}")
    if "flash_attention" not in settings and x.stores_scores is False:
        settings["flash_attention"] = True  # the model keeps no s x s tensor: nor will it there
    settings.setdefault("dropout", x.dropout)  # the model's own dropout, unless told
    trainable = _trainable_fraction(module)
    if "trainable" not in settings and trainable < 1.0:  # frozen parameters (LoRA's base)
        settings["trainable"] = trainable
        notes.append(f"trainable={trainable:.4g}: the share of parameters that require grad")
    base = plan(spec, gpu, gpus=gpus, seq=seq_len or x.seq, **settings)
    placement, why = _target_placement(module, base.parallel, tp_plan, pp_split)
    if why:
        notes.append(why)
    scaled = evaluate(*_specs(base), activation_scale=scale, placement=placement)
    return MeasuredPlan(
        plan=scaled,
        formula_plan=base,
        measurement=x,
        scale=scale,
        shape_sources=shape_sources,
        notes=tuple(notes),
        placed=placement is not None,
    )


def _trainable_fraction(module: nn.Module) -> float:
    counts = [(p.numel(), p.requires_grad) for p in module.parameters()]
    total = sum(n for n, _ in counts)
    return sum(n for n, grad in counts if grad) / total if total else 1.0


def _check_inputs(sample: Any, data: Any, batch_size: Any, seq_len: Any) -> None:
    if sample is None and data is None:
        raise ConfigError(
            "plan_from needs a batch to measure on: give sample=(inputs, targets) or "
            "data= (a Dataset or a callable, as for the Stepper)"
        )
    if isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size < 1:
        raise ConfigError(f"batch_size={batch_size!r} is not valid; it must be an integer >= 1")
    if seq_len is not None and (
        isinstance(seq_len, bool) or not isinstance(seq_len, int) or seq_len < 1
    ):
        raise ConfigError(f"seq_len={seq_len!r} is not valid; it must be an integer >= 1")


def _specs(p: Plan) -> tuple[Any, TrainingSpec, ParallelSpec, HardwareSpec]:
    return p.model, p.training, p.parallel, p.hardware


def _target_placement(
    module: nn.Module, parallel: ParallelSpec, tp_plan: Any, pp_split: Any
) -> tuple[Placement | None, str]:
    """The model's parameters placed by the target layout, or None and why not."""
    if parallel.cp > 1 or parallel.first_stage_layers or parallel.last_stage_layers:
        return None, (
            "model state from the parameter count: context parallel and first/last stage "
            "sizes are not layouts the workbench builds"
        )
    try:
        layout = Layout(
            dp=parallel.dp,
            tp=parallel.tp,
            pp=parallel.pp,
            zero=parallel.zero,
            tp_plan=tp_plan,
            pp_split=pp_split,
        )
        return module_placement(module, layout, parallel.world), ""
    except WorkbenchError as exc:
        return None, f"model state from the parameter count; the layout cannot place it: {exc}"
