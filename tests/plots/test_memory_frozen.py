"""Frozen weights (a LoRA model's base) are a category of their own in the memory figure and
its hover text, drawn in their own colour, only once a rank reports some."""

from __future__ import annotations

from workbench.plots import CATEGORY_COLORS, memory_figure
from workbench.plots.style import MIB
from workbench.trace.events import MemorySample


def _sample(step: int, frozen: int) -> MemorySample:
    return MemorySample(
        rank=0, step=step, phase="data", t=step + 1, params=MIB, grads=MIB, optimizer=2 * MIB,
        activations=0, frozen=frozen,
    )  # fmt: skip


def test_frozen_weights_get_their_own_trace_and_count_in_the_total() -> None:
    fig = memory_figure([_sample(0, 30 * MIB), _sample(1, 30 * MIB)])
    frozen = next(t for t in fig.data if t.name == "frozen")
    assert list(frozen.y) == [30.0, 30.0] and frozen.fillcolor == CATEGORY_COLORS["frozen"]
    assert "frozen: 30" in frozen.hovertext[0] and "total 34" in frozen.hovertext[0]
    assert _sample(0, 30 * MIB).total == 34 * MIB
    # A full fine-tune: no frozen trace at all.
    assert "frozen" not in {t.name for t in memory_figure([_sample(0, 0)]).data}
