"""One table says what a strategy name means (``parallelize.STRATEGY_LAYOUTS``).

Every name a validator accepts (``RunSpec``'s ``STRATEGIES``, ``layout_for``, a user run's
presets) maps to the same ``ParallelDims`` whichever way it is read: ``RunSpec.dims`` (the
mesh a run is built on), ``layout_for`` (the layout ``parallelize`` applies) and the
planner bridge's ``strategy_layout`` (the layout a plan is made for).
"""

from __future__ import annotations

import pytest

from workbench.errors import ParallelError
from workbench.parallel.parallelize import PRESET_LAYOUTS, STRATEGY_LAYOUTS, layout_for
from workbench.parallel.planning.run_plan import strategy_layout
from workbench.parallel.run_spec import STRATEGIES, RunSpec

WORLDS = range(1, 9)


def test_the_validators_accept_the_names_of_the_one_table() -> None:
    assert set(STRATEGIES) == set(STRATEGY_LAYOUTS)
    assert set(PRESET_LAYOUTS) == set(STRATEGY_LAYOUTS) - {"megatron"}
    for name in STRATEGIES:
        RunSpec(strategy=name)  # accepted
    with pytest.raises(ValueError, match=r"strategy='ddp'.*megatron"):
        layout_for("ddp", 2)  # the table's names are the choices named


@pytest.mark.parametrize("strategy", STRATEGIES)
def test_a_strategy_name_maps_to_the_same_dims_both_ways(strategy: str) -> None:
    spec = RunSpec(strategy=strategy)
    for world in WORLDS:
        try:
            layout = layout_for(strategy, world, overlap=spec.overlap)
        except ParallelError as exc:
            with pytest.raises(ParallelError) as raised:
                spec.dims(world)
            assert str(raised.value) == str(exc)
            continue
        mesh_world = 1 if strategy == "single" else world
        dims = spec.dims(world)
        assert dims == layout.dims(mesh_world), (strategy, world)
        assert strategy_layout(spec, world) == layout, (strategy, world)
        assert dims.world_size == mesh_world
