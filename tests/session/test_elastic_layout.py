"""Which survivors a layout can use and how the global batch is kept at a new world size
(``session/elastic_run.py``), with no engines."""

from __future__ import annotations

import pytest

from workbench.errors import ConfigError
from workbench.parallel import RunSpec
from workbench.session.elastic_run import resized_spec, usable_after_loss


def test_shrink_keeps_the_global_batch_by_raising_accumulation() -> None:
    spec = RunSpec(strategy="dp", batch_size=8)
    new, note = resized_spec(spec, 4, 2)
    assert (new.batch_size, new.grad_accum) == (8, 2)  # micro-batch 2 per rank, as before
    assert "global batch 8 kept" in note and "1 -> 2" in note
    back, _ = resized_spec(new, 2, 4)
    assert (back.batch_size, back.grad_accum) == (8, 1)


@pytest.mark.parametrize("strategy", ["dp", "zero1", "zero2", "fsdp"])
def test_a_data_parallel_run_down_to_one_rank_goes_on_as_the_single_device_run(
    strategy: str,
) -> None:
    spec = RunSpec(strategy=strategy, batch_size=4)
    new, note = resized_spec(spec, 2, 1)
    assert (new.strategy, new.batch_size, new.grad_accum) == ("single", 4, 2)
    assert f"strategy {strategy!r} -> 'single'" in note and "global batch 4 kept" in note
    new.dims(1)  # a layout one rank can run


def test_accumulation_that_does_not_divide_takes_smaller_micro_batches() -> None:
    new, _ = resized_spec(RunSpec(strategy="dp", batch_size=6), 3, 2)
    assert (new.batch_size, new.grad_accum) == (6, 3)  # 3 per rank: micro-batches of 1


def test_a_batch_the_new_size_does_not_divide_becomes_the_nearest_and_says_so() -> None:
    new, note = resized_spec(RunSpec(strategy="dp", batch_size=8), 4, 3)
    assert new.batch_size == 9 and new.batch_size % 3 == 0
    assert "changed to the nearest that does, 9" in note and "differ from" in note


def test_dp_tp_shrinks_by_whole_pairs() -> None:
    spec = RunSpec(strategy="dp_tp", batch_size=8)
    assert usable_after_loss(spec, 4, [3]) == [2]  # rank 3's TP partner leaves too
    assert usable_after_loss(spec, 4, [2, 3]) == []
    new, _ = resized_spec(spec, 4, 2)
    assert (new.batch_size, new.grad_accum) == (8, 2)


@pytest.mark.parametrize("strategy", ["tp", "megatron", "pp"])
def test_a_loss_in_the_only_model_parallel_group_names_layouts_that_fit(strategy: str) -> None:
    with pytest.raises(ConfigError) as info:
        usable_after_loss(RunSpec(strategy=strategy, batch_size=8), 4, [1])
    message = str(info.value)
    assert f"strategy={strategy!r}" in message and "ranks [1]" in message
    assert "'dp_tp'" in message and "3 ranks left" in message


def test_dp_tp_with_no_complete_pair_left_is_an_error() -> None:
    with pytest.raises(ConfigError, match="no complete pair"):
        usable_after_loss(RunSpec(strategy="dp_tp", batch_size=8), 4, [0, 3])


def test_data_parallel_layouts_lose_only_the_dead() -> None:
    for strategy in ("dp", "zero1", "zero2", "fsdp"):
        assert usable_after_loss(RunSpec(strategy=strategy, batch_size=8), 4, [1, 2]) == []


def test_new_arguments_are_refused_before_anything_starts() -> None:
    from workbench.cluster import Cluster
    from workbench.session.training import TrainingSession

    cluster = Cluster(n=2, backend="gloo")  # never started: every check fires first
    with pytest.raises(ConfigError, match=r"n=0 is not valid"):
        cluster.grow_sync(0)
    with pytest.raises(ConfigError, match=r"shrink='yes' is not valid"):
        cluster.recover_sync(shrink="yes")  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match=r"elastic='yes' is not valid"):
        TrainingSession(cluster, RunSpec(), elastic="yes")  # type: ignore[arg-type]
    session = TrainingSession(cluster, RunSpec(), elastic=True)
    with pytest.raises(ConfigError, match=r"shrink=1 is not valid"):
        session.recover(shrink=1)  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match=r"n=-1 is not valid"):
        session.grow(-1)
    assert cluster.state not in ("running", "degraded")


def test_a_run_of_your_own_model_is_not_resized() -> None:
    from types import SimpleNamespace

    from workbench.cluster import Cluster
    from workbench.session.training import TrainingSession

    session = TrainingSession(Cluster(n=2, backend="gloo"), RunSpec(), elastic=True)
    session._state.spec = SimpleNamespace(strategy="dp")  # type: ignore[assignment]
    with pytest.raises(ConfigError, match="built-in models"):
        session._shrink_and_roll_back()
    with pytest.raises(ConfigError, match="built-in models"):
        session.grow(1)
