"""Plain-text tables of plans, for the CLI and for ``print`` in a notebook."""

from __future__ import annotations

from collections.abc import Sequence

from workbench.planner.plan import Plan

__all__ = ["format_plan", "format_plans"]

_GB = 1e9


def format_plan(plan: Plan) -> str:
    m, t, hw = plan.memory, plan.time, plan.hardware
    model = plan.model
    shape = f"{model.layers}L h={model.hidden} a={model.heads}"
    lines = [
        f"model     {model.name}: {model.n_params / 1e9:.3g}B params ({shape}"
        f"{', assumed' if model.shape_assumed else ''})",
        f"hardware  {plan.gpus}x {hw.name} on {plan.nodes} node(s) "
        f"({hw.gpus_per_node}/node, intra {hw.intra.name}, inter {hw.inter.name})",
        f"layout    {plan.layout()}",
        f"training  {plan.training.precision} {plan.training.optimizer}, seq {plan.seq}, "
        f"global batch {plan.global_batch}",
        "",
        "memory per GPU            GB",
    ]
    for label, value in (
        ("weights", m.weights),
        ("gradients", m.grads),
        ("optimizer state", m.optimizer),
        ("activations", m.activations),
        ("temporary buffers", m.temporary),
    ):
        lines.append(f"  {label:<22}{value / _GB:>8.2f}")
    lines += [
        f"  {'total':<22}{m.total / _GB:>8.2f}",
        f"  {'usable':<22}{m.capacity / _GB:>8.2f}",
        f"  {'headroom':<22}{m.headroom / _GB:>8.2f}",
    ]
    if m.host:
        lines.append(f"  {'host memory (offload)':<22}{m.host / _GB:>8.2f}")
    lines += [
        "",
        f"verdict   {plan.verdict}",
        "",
        "step time                 s",
        f"  {'compute':<22}{t.compute:>8.4g}",
        f"  {'pipeline bubble':<22}{t.bubble:>8.4g}",
        f"  {'dp/zero comm (total)':<22}{t.dp_comm:>8.4g}{'  inter-node' if t.dp_inter else ''}",
        f"  {'dp/zero comm exposed':<22}{t.dp_exposed:>8.4g}",
        f"  {'tp comm':<22}{t.tp_comm:>8.4g}{'  inter-node' if t.tp_inter else ''}",
        f"  {'pp p2p':<22}{t.pp_comm:>8.4g}{'  inter-node' if t.pp_inter else ''}",
    ]
    if t.cp_comm:
        lines.append(f"  {'cp comm':<22}{t.cp_comm:>8.4g}")
    if t.ep_comm:
        lines.append(f"  {'ep comm':<22}{t.ep_comm:>8.4g}")
    if t.overhead:
        lines.append(f"  {'optimizer/overhead':<22}{t.overhead:>8.4g}")
    if t.offload:
        lines.append(f"  {'offload copies':<22}{t.offload:>8.4g}")
    lines += [
        f"  {'step':<22}{t.total:>8.4g}",
        f"throughput {t.tokens_per_s:,.0f} tokens/s; {t.efficiency:.0%} of the step computing; "
        f"MFU {t.mfu:.0%} (HFU {t.hfu:.0%}, {t.tflops_per_gpu:.0f} TFLOP/s per GPU)",
    ]
    if plan.notes:
        lines.append("")
        lines += [f"note: {n}" for n in plan.notes]
    return "\n".join(lines)


def format_plans(plans: Sequence[Plan]) -> str:
    """One line per plan: layout, memory, verdict, throughput."""
    header = f"{'layout':<54}{'GB/GPU':>8}{'fits':>6}{'tokens/s':>14}{'eff':>6}"
    rows = [header]
    for p in plans:
        rows.append(
            f"{p.layout():<54}{p.memory.total / _GB:>8.1f}{'yes' if p.fits else 'OOM':>6}"
            f"{p.tokens_per_s:>14,.0f}{p.time.efficiency:>6.0%}"
        )
    return "\n".join(rows)
