"""One place for colors, units and names, so every figure speaks the same visual language.

A category, phase or op keeps its color in every figure (memory, timeline, planner), which is
what lets a reader match "grads" in the memory plot with "backward" in the timeline.
"""

from __future__ import annotations

import re
import zlib

__all__ = [
    "CATEGORIES",
    "CATEGORY_COLORS",
    "GB",
    "MIB",
    "OP_COLORS",
    "PHASE_COLORS",
    "base_phase",
    "category_color",
    "format_bytes",
    "op_color",
    "phase_color",
]

MIB = 1 << 20  # memory axes are in MiB (binary), like torch.cuda.memory_summary
GB = 1e9  # bandwidth is in GB/s (decimal), like nccl-tests

# Memory categories in stacking order: what exists longest sits at the bottom.
# "frozen" (weights that do not require grad, a LoRA model's base) is drawn only once a
# rank reports some, like "other".
CATEGORIES: tuple[str, ...] = ("params", "grads", "optimizer", "activations", "other", "frozen")

CATEGORY_COLORS: dict[str, str] = {
    "params": "#4C78A8",
    "grads": "#F58518",
    "optimizer": "#54A24B",
    "activations": "#B279A2",
    "other": "#9D9D9D",
    "frozen": "#9ECAE9",  # a light params blue: weights, but no gradients or state
}

# Compute phases; micro-batch variants ("forward[mb=1]") use their base phase's color.
PHASE_COLORS: dict[str, str] = {
    "data": "#9D755D",
    "forward": "#4C78A8",
    "backward": "#F58518",
    # a zero-bubble schedule's split backward: B (input gradient), W (weight gradient)
    "backward_input": "#F58518",
    "backward_weight": "#E45756",
    "sync": "#BAB0AC",
    "optimizer": "#54A24B",
}

# Collectives: saturated colors distinct from the phase palette, so a comm bar never reads
# as compute.
OP_COLORS: dict[str, str] = {
    "all_reduce": "#D62728",
    "all_gather": "#17BECF",
    "reduce_scatter": "#9467BD",
    "all_to_all": "#E377C2",
    "broadcast": "#BCBD22",
    "reduce": "#8C564B",
    "send": "#2CA02C",
    "recv": "#1F77B4",
    "barrier": "#7F7F7F",
}

# Unknown names still get a stable color (same name -> same color in every session).
_FALLBACK = ("#FF9DA6", "#72B7B2", "#EECA3B", "#B6E880", "#FF97FF", "#FECB52", "#636EFA")

_SUFFIX = re.compile(r"\[.*\]$")


def _fallback(name: str) -> str:
    return _FALLBACK[zlib.crc32(name.encode()) % len(_FALLBACK)]


def base_phase(phase: str) -> str:
    """``"forward[mb=1]"`` -> ``"forward"``; names without a suffix are returned unchanged."""
    return _SUFFIX.sub("", phase).strip()


def phase_color(phase: str) -> str:
    base = base_phase(phase)
    return PHASE_COLORS.get(base) or _fallback(base)


def op_color(op: str) -> str:
    return OP_COLORS.get(op) or _fallback(op)


def category_color(category: str) -> str:
    return CATEGORY_COLORS.get(category) or _fallback(category)


def format_bytes(n: float) -> str:
    """Human-readable binary size: ``512 B``, ``3.0 KiB``, ``25.0 MiB``, ``1.50 GiB``."""
    value = float(n)
    unit = "B"
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(value) < 1024 or unit == "TiB":
            break
        value /= 1024
    if unit == "B":
        return f"{value:.0f} B"
    return f"{value:.{2 if unit in ('GiB', 'TiB') else 1}f} {unit}"
