"""The doctor's link heatmap."""

from __future__ import annotations

from workbench.plots.network import link_heatmap


def test_pairs_fill_both_cells_and_slow_pairs_are_marked() -> None:
    fig = link_heatmap(3, [(0, 1, 2.0), (1, 2, 0.5)], flagged=[(2, 1)])
    (heat,) = fig.data
    assert heat.z[0][1] == heat.z[1][0] == 2.0
    assert heat.z[0][2] is None  # not measured
    assert heat.text[1][2] == heat.text[2][1] == "0.5 x"
    assert heat.text[0][1] == "2"
