"""The planner widget: sliders for model size, GPUs and network; live bars and verdicts.

State lives in ``PlannerState`` (a plain object that computes plans with the pure planner
functions); ``PlannerWidget`` only maps controls to that state and draws the result, with
figure updates batched so the front end redraws once per change.
"""

from __future__ import annotations

import html
from dataclasses import dataclass, field
from typing import Any

import ipywidgets as widgets
import plotly.graph_objects as go

from workbench.errors import ConfigError
from workbench.planner import (
    GPUS,
    LINKS,
    MODELS,
    PRECISIONS,
    RECOMPUTE,
    HardwareSpec,
    ModelSpec,
    ParallelSpec,
    Plan,
    ScalingPoint,
    TrainingSpec,
    evaluate,
    hardware_preset,
    model_preset,
    recommend,
)
from workbench.planner.specs import GRAD_DTYPES, GRAD_SYNC, ZERO3_PREFETCH
from workbench.planner.sweep import scaling
from workbench.plots.planner import MEMORY_PARTS, memory_breakdown_figure, scaling_figure

__all__ = ["CUSTOM", "PlannerState", "PlannerWidget"]

CUSTOM = "custom size"
GPU_COUNTS: tuple[int, ...] = tuple(2**k for k in range(11))  # 1 .. 1024


@dataclass(slots=True)
class PlannerState:
    """Everything the widget shows, as plain values; ``plan()`` is the pure computation."""

    model: str = "llama2-7b"
    params_b: float = 7.0  # billions, used when model == CUSTOM
    gpu: str | HardwareSpec = "a100-80gb"  # a preset's name, or e.g. cluster.measured_hardware()
    gpus: int = 8
    inter: str | None = None  # None: the GPU preset's usual network
    zero: int = 0
    tp: int = 1
    pp: int = 1
    recompute: str = "none"
    precision: str = "bf16-mixed"
    micro_batch: int = 1
    seq: int = 2048
    flash_attention: bool = False
    fused_swiglu: bool = False
    grads: str = "auto"
    grad_sync: str = "per_microbatch"
    zero3_prefetch: str = "layer"
    fp8: bool = False
    offload_optimizer: bool = False
    offload_activations: bool = False
    extra: dict[str, Any] = field(default_factory=dict)  # more TrainingSpec fields

    def model_spec(self) -> ModelSpec:
        if self.model == CUSTOM:
            n = round(self.params_b * 1e9)
            return ModelSpec(name=f"{self.params_b:.3g}B", params=n, vocab=32000, seq=self.seq)
        return model_preset(self.model)

    def training(self) -> TrainingSpec:
        return TrainingSpec(
            micro_batch=self.micro_batch,
            seq=self.seq,
            precision=self.precision,
            recompute=self.recompute,
            flash_attention=self.flash_attention,
            fused_swiglu=self.fused_swiglu,
            grads=self.grads,
            grad_sync=self.grad_sync,
            zero3_prefetch=self.zero3_prefetch,
            fp8=self.fp8,
            offload_optimizer=self.offload_optimizer,
            offload_activations=self.offload_activations,
            **self.extra,
        )

    def hardware(self) -> Any:
        if isinstance(self.gpu, HardwareSpec):  # measured (cluster.measured_hardware())
            return self.gpu if self.inter is None else self.gpu.with_(inter=LINKS[self.inter])
        return hardware_preset(self.gpu, inter=self.inter)

    def layout(self) -> ParallelSpec:
        block = self.tp * self.pp
        if self.gpus % block:
            raise ConfigError(f"{self.gpus} GPUs cannot hold tp·pp={block}")
        dp = self.gpus // block
        return ParallelSpec(
            dp=dp,
            tp=self.tp,
            pp=self.pp,
            zero=self.zero if dp > 1 else 0,
            sequence_parallel=self.tp > 1,
            micro_batches=4 * self.pp if self.pp > 1 else None,
        )

    def plan(self) -> Plan:
        return evaluate(self.model_spec(), self.training(), self.layout(), self.hardware())

    def scaling(self) -> list[ScalingPoint]:
        counts = [g for g in GPU_COUNTS if g <= max(self.gpus * 4, 8)]
        return scaling(
            self.model_spec(),
            self.hardware(),
            self.training(),
            gpus=counts,
            tp=self.tp,
            pp=self.pp,
            zero=self.zero,
        )


def _gpu_options(gpu: str | HardwareSpec) -> list[tuple[str, Any]]:
    """The presets, and a measured ``HardwareSpec`` the widget was given, by name."""
    own = [(gpu.name, gpu)] if isinstance(gpu, HardwareSpec) else []
    return [*((k, k) for k in GPUS), *own]


def _verdict_html(plan: Plan) -> str:
    color = "#2CA02C" if plan.fits else "#D62728"
    t = plan.time
    notes = "".join(f"<br><small>{html.escape(n)}</small>" for n in plan.notes)
    return (
        f"<b style='color:{color}'>{html.escape(plan.verdict)}</b><br>"
        f"{html.escape(plan.layout())} on {plan.gpus}x {html.escape(plan.hardware.name)} "
        f"({plan.nodes} node(s))<br>"
        f"{t.tokens_per_s:,.0f} tokens/s &middot; step {t.total:.3g} s &middot; "
        f"{t.efficiency:.0%} computing &middot; MFU {t.mfu:.0%} (HFU {t.hfu:.0%}){notes}"
    )


class PlannerWidget:
    """Interactive planner. ``display(PlannerWidget())`` in a notebook; ``.state`` holds
    the values, ``.plan`` the latest plan, ``.verdict`` / ``.memory_fig`` / ``.scaling_fig``
    the views (all driven programmatically too)."""

    def __init__(self, state: PlannerState | None = None, **values: Any) -> None:
        self.state = state or PlannerState()
        for key, value in values.items():
            if not hasattr(self.state, key):
                raise ConfigError(f"unknown planner setting {key!r}")
            setattr(self.state, key, value)
        self._controls = self._make_controls(self.state)
        self.verdict = widgets.HTML()
        self.reasons = widgets.HTML()
        self.recommend_button = widgets.Button(description="recommend")
        self.recommend_button.on_click(lambda _: self.show_recommendation())
        self.plan: Plan | None = None
        self.memory_fig = go.FigureWidget(memory_breakdown_figure(self.state.plan()))
        self.scaling_fig = go.FigureWidget(scaling_figure(self.state.scaling()))
        for name, control in self._controls.items():
            control.observe(lambda change, n=name: self._on_change(n, change["new"]), "value")
        self.view = self._make_view()
        self.refresh()

    def _make_controls(self, s: PlannerState) -> dict[str, widgets.ValueWidget]:
        """One control per ``PlannerState`` field, set to its value: {field: control}."""
        self.model = widgets.Dropdown(options=[*MODELS, CUSTOM], value=s.model, description="model")
        self.size = widgets.FloatLogSlider(
            value=s.params_b, base=10, min=-1, max=3, step=0.05, description="size (B)"
        )
        self.gpu = widgets.Dropdown(options=_gpu_options(s.gpu), value=s.gpu, description="GPU")
        self.gpus = widgets.SelectionSlider(
            options=list(GPU_COUNTS), value=s.gpus, description="GPUs"
        )
        self.network = widgets.Dropdown(
            options=[("preset", None), *((k, k) for k in LINKS)],
            value=s.inter,
            description="network",
        )
        self.zero = widgets.ToggleButtons(options=[0, 1, 2, 3], value=s.zero, description="ZeRO")
        self.tp = widgets.Dropdown(options=[1, 2, 4, 8], value=s.tp, description="TP")
        self.pp = widgets.Dropdown(options=[1, 2, 4, 8, 16], value=s.pp, description="PP")
        self.recompute = widgets.Dropdown(
            options=list(RECOMPUTE), value=s.recompute, description="recompute"
        )
        self.precision = widgets.Dropdown(
            options=list(PRECISIONS), value=s.precision, description="precision"
        )
        self.flash = widgets.Checkbox(value=s.flash_attention, description="FlashAttention")
        self.fused = widgets.Checkbox(value=s.fused_swiglu, description="fused SwiGLU")
        self.grads = widgets.Dropdown(options=list(GRAD_DTYPES), value=s.grads,
                                      description="grads")  # fmt: skip
        self.grad_sync = widgets.Dropdown(options=list(GRAD_SYNC), value=s.grad_sync,
                                          description="grad sync")  # fmt: skip
        self.zero3_prefetch = widgets.Dropdown(options=list(ZERO3_PREFETCH),
                                               value=s.zero3_prefetch,
                                               description="ZeRO-3 fetch")  # fmt: skip
        self.fp8 = widgets.Checkbox(value=s.fp8, description="FP8 matmuls")
        self.offload_opt = widgets.Checkbox(value=s.offload_optimizer,
                                            description="offload optimizer")  # fmt: skip
        self.offload_act = widgets.Checkbox(value=s.offload_activations,
                                            description="offload activations")  # fmt: skip
        return {
            "model": self.model,
            "params_b": self.size,
            "gpu": self.gpu,
            "gpus": self.gpus,
            "inter": self.network,
            "zero": self.zero,
            "tp": self.tp,
            "pp": self.pp,
            "recompute": self.recompute,
            "precision": self.precision,
            "flash_attention": self.flash,
            "fused_swiglu": self.fused,
            "grads": self.grads,
            "grad_sync": self.grad_sync,
            "zero3_prefetch": self.zero3_prefetch,
            "fp8": self.fp8,
            "offload_optimizer": self.offload_opt,
            "offload_activations": self.offload_act,
        }

    def _make_view(self) -> widgets.VBox:
        return widgets.VBox(
            [
                widgets.HBox([widgets.VBox([self.model, self.size, self.gpu, self.gpus,
                                            self.network]),
                              widgets.VBox([self.zero, self.tp, self.pp, self.recompute,
                                            self.precision, self.recommend_button]),
                              widgets.VBox([self.flash, self.fused, self.grads,
                                            self.grad_sync, self.zero3_prefetch, self.fp8,
                                            self.offload_opt,
                                            self.offload_act])]),
                self.verdict,
                widgets.HBox([self.memory_fig, self.scaling_fig]),
                self.reasons,
            ]
        )  # fmt: skip

    def _on_change(self, name: str, value: Any) -> None:
        setattr(self.state, name, value)
        if name == "params_b" and self.model.value != CUSTOM:
            self.model.value = CUSTOM  # moving the size slider means "a model this big"
            return  # the model observer refreshes
        self.refresh()

    def refresh(self) -> None:
        """Recompute from ``state`` and redraw (one batched update per figure)."""
        try:
            plan = self.state.plan()
            points = self.state.scaling()
        except ConfigError as exc:
            self.plan = None
            self.verdict.value = f"<b style='color:#D62728'>invalid: {html.escape(str(exc))}</b>"
            return
        self.plan = plan
        self.verdict.value = _verdict_html(plan)
        with self.memory_fig.batch_update():
            label = [plan.layout()]
            for trace, (attr, _, _) in zip(self.memory_fig.data, MEMORY_PARTS, strict=False):
                trace.x = label
                trace.y = [getattr(plan.memory, attr) / 1e9]
            limit = self.memory_fig.data[len(MEMORY_PARTS)]
            limit.x, limit.y = label, [plan.memory.capacity / 1e9]
            self.memory_fig.layout.title.text = plan.verdict
        fresh = scaling_figure(points)
        with self.scaling_fig.batch_update():
            for trace, new in zip(self.scaling_fig.data, fresh.data, strict=False):
                trace.x, trace.y = new.x, new.y
                if new.marker is not None and new.marker.symbol is not None:
                    trace.marker.symbol = new.marker.symbol
                if new.customdata is not None:
                    trace.customdata = new.customdata

    def show_recommendation(self) -> None:
        s = self.state
        rec = recommend(s.model_spec(), s.hardware(), s.gpus, s.training())
        self.reasons.value = "<br>".join(html.escape(r) for r in rec.reasons)

    def _repr_mimebundle_(self, **kwargs: Any) -> Any:
        return self.view._repr_mimebundle_(**kwargs)
