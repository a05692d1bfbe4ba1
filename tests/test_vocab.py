"""parallel/ and planner/ share one vocabulary (workbench.vocab): what runs can be planned."""

from __future__ import annotations

import pytest

from workbench import vocab
from workbench.parallel import OPTIMIZERS as PARALLEL_OPTIMIZERS
from workbench.parallel.options import PRECISIONS as PARALLEL_PRECISIONS
from workbench.parallel.parallelize import ZERO_STAGES as PARALLEL_ZERO_STAGES
from workbench.parallel.pp import SCHEDULES as PARALLEL_SCHEDULES
from workbench.planner import TrainingSpec
from workbench.planner.memory import state_bytes_per_param


def test_the_runtime_uses_the_vocabulary_lists() -> None:
    assert PARALLEL_PRECISIONS == vocab.RUN_PRECISIONS
    assert PARALLEL_OPTIMIZERS == vocab.RUN_OPTIMIZERS
    assert sorted(PARALLEL_SCHEDULES) == sorted(vocab.RUN_SCHEDULES)
    assert PARALLEL_ZERO_STAGES == vocab.ZERO_STAGES


@pytest.mark.parametrize(
    ("kind", "names", "planned"),
    [
        ("precision", vocab.RUN_PRECISIONS, vocab.PRECISIONS),
        ("optimizer", vocab.RUN_OPTIMIZERS, vocab.OPTIMIZERS),
        ("schedule", vocab.RUN_SCHEDULES, vocab.SCHEDULES),
    ],
)
def test_everything_that_runs_has_a_planner_name(
    kind: str, names: tuple[str, ...], planned: tuple[str, ...]
) -> None:
    assert all(vocab.planner_name(kind, n) in planned for n in names)


def test_the_runtime_sgd_is_planned_with_its_momentum_buffer() -> None:
    """The runtime's SGD keeps momentum (4 B/param in fp32): planning it as plain SGD would
    predict 4 bytes per parameter too few."""
    sgd = TrainingSpec(precision="fp32", optimizer=vocab.planner_name("optimizer", "sgd"))
    adamw = TrainingSpec(precision="fp32", optimizer=vocab.planner_name("optimizer", "adamw"))
    assert state_bytes_per_param(sgd).optimizer == 4
    assert state_bytes_per_param(adamw).optimizer == 8


def test_an_unknown_kind_is_refused() -> None:
    with pytest.raises(ValueError, match="valid: precision"):
        vocab.planner_name("colour", "red")
