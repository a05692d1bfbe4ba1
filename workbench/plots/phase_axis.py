"""Phases and steps on a memory figure's x axis, so nobody has to hover to read them.

Consecutive samples of one rank with the same step and base phase form a *band*
(``[step, phase, first x, last x]``, plain JSON so it lives in the figure's meta). The axis
labels each band with its phase at a whole sample inside it (names on two alternating lines)
and marks every step boundary with a dotted grid line; a step's first band carries "step N"
on a third line. With more bands than fit, the labels fall back to one "step N" per (every
k-th) step. There are no numeric ticks on a sample axis at all, so none can be fractional.
"""

from __future__ import annotations

import math
from typing import Any

from workbench.plots.style import base_phase

__all__ = [
    "MAX_PHASE_TICKS",
    "MAX_STEP_TICKS",
    "STEP_LABELS_ACROSS",
    "band_name",
    "band_ticks",
    "boundary_grid",
    "extend_bands",
    "spaced",
]

# On two staggered lines, about 550 px of axis (the stepper's figure beside its controls
# at 1,280 px) holds 20 phase names ("optimizer" is the widest, ~50 px); past that they
# would overlap ("backward" over "optimizer" at 22 was seen), so steps only.
MAX_PHASE_TICKS = 20
MAX_STEP_TICKS = 25
# "step 12" in bold is ~50 px: an axis of ~550 px (the stepper's figure beside its controls
# at 1,280 px) holds 9 of them with room between, so labels are at least 1/9 of it apart
# (at 1/12, "step 10" and "step 11" touched after Run 10).
STEP_LABELS_ACROSS = 9
_BOUNDARY = {"showgrid": True, "gridcolor": "#555555", "griddash": "dot", "gridwidth": 1}
# On a time axis a short tick under each boundary, between the numbers. On a sample axis
# none: a one-sample band's name ("optimizer", the last of a step) is wider than its band
# and reaches over the boundary, which a tick running down through the label rows would
# strike through; the dotted grid line above the axis marks the boundary alone.
_TIME_TICK = {"ticks": "outside", "tickcolor": "#999999", "ticklen": 6}
_NO_TICK = {"ticks": ""}
_STANDOFF_PX = 8

Band = list[Any]  # [step, phase, first x, last x]


def band_name(phase: str, label: str = "") -> str:
    """What the axis calls a sample: its base phase; outside any phase (the "start" sample
    before the first step, "end" after the last), its label, since a "?" tells a class
    nothing."""
    return base_phase(phase) or label or "no phase"


def extend_bands(bands: list[Band], step: int, name: str, x: float) -> None:
    """Add a sample named ``name`` (``band_name``) at ``x``, after every earlier one of its
    rank, to ``bands`` in place."""
    if bands and bands[-1][0] == step and bands[-1][1] == name:
        bands[-1][3] = x
    else:
        bands.append([step, name, x, x])


def _step_starts(bands: list[Band]) -> list[int]:
    """Indices of the bands that open a step (the first band and every step change)."""
    return [i for i, b in enumerate(bands) if i == 0 or b[0] != bands[i - 1][0]]


def spaced(positions: list[float], extent: float) -> list[int]:
    """Indices of ``positions`` (ascending) to label: the first, then each one at least
    ``1 / STEP_LABELS_ACROSS`` of ``extent`` past the last one kept, and never more than
    ``MAX_STEP_TICKS``. Steps differ in width (a step clicked phase by phase holds its
    pauses, a Run N step does not), so every k-th would still pile narrow ones up."""
    if not positions:
        return []
    gap = extent / STEP_LABELS_ACROSS
    kept = [0]
    for i in range(1, len(positions)):
        if positions[i] - positions[kept[-1]] >= gap:
            kept.append(i)
    return kept[:: max(1, math.ceil(len(kept) / MAX_STEP_TICKS))]


def _every_kth_step(bands: list[Band]) -> list[int]:
    """Step-opening bands, spaced (``spaced``) so that their "step N" labels do not touch."""
    starts = _step_starts(bands)
    extent = bands[-1][3] - bands[0][2] + 1 if bands else 0
    return [starts[i] for i in spaced([bands[i][2] for i in starts], extent)]


def _boundaries(bands: list[Band], opening: list[int], tick: dict[str, Any]) -> dict[str, Any]:
    """Dotted grid lines where the marked steps begin: midway between the last sample of
    the step before and the first of the step (``first - 0.5`` on a sample axis). Minor grid
    lines are two arrays on the axis, so a long run adds no shapes to re-send."""
    where = [(bands[i - 1][3] + bands[i][2]) / 2 for i in opening if i > 0]
    if not where:  # plotly.js stops drawing the figure at an empty tickvals array
        return {}
    return {"minor": {**_BOUNDARY, **tick, "tickmode": "array", "tickvals": where}}


def band_ticks(bands: list[Band]) -> dict[str, Any]:
    """Axis properties for a sample axis: phase (and step) labels at whole samples inside
    their bands, no numeric ticks at all, dotted step boundaries."""
    if not bands:
        return {"showticklabels": False}  # nothing sampled yet: no numbers either
    if len(bands) <= MAX_PHASE_TICKS:
        opening = _step_starts(bands)
        vals = [int(b[2] + (b[3] - b[2]) // 2) for b in bands]
        text = _staggered(bands, set(opening))
    else:
        opening = _every_kth_step(bands)
        vals = [int(bands[i][2]) for i in opening]
        text = [f"<b>step {bands[i][0]}</b>" for i in opening]
    return {
        "tickmode": "array",
        "tickvals": vals,
        "ticktext": text,
        "tickangle": 0,  # staggered lines instead of plotly's tilt, which tangles them
        # the y axis's "0" hangs half below the axis, right over the first phase name
        "ticklabelstandoff": _STANDOFF_PX,
        "showgrid": False,
        **_boundaries(bands, opening, _NO_TICK),
    }


def _staggered(bands: list[Band], opening: set[int]) -> list[str]:
    """Phase names on two alternating lines, so each has twice a band's width to itself;
    the first band of a step adds "step N" on a third line."""
    out = []
    for i, (step, phase, _first, _last) in enumerate(bands):
        lines = [phase] if i % 2 == 0 else ["", phase]
        if i in opening:
            lines += [""] * (3 - len(lines) - 1) + [f"<b>step {step}</b>"]
        out.append("<br>".join(lines))
    return out


def boundary_grid(bands: list[Band]) -> dict[str, Any]:
    """Axis properties for a time axis: its numeric ticks kept, step boundaries dotted."""
    return _boundaries(bands, _every_kth_step(bands), _TIME_TICK)
