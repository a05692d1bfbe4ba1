"""The stepper on the user's own model, data, loss and optimizer (shared 2-rank cluster):
factories shipped with cloudpickle or named on the engines, phases/memory/collectives as
for the built-in models, the sharding check, and clear errors for what cannot run."""

from __future__ import annotations

import threading
from collections import Counter
from collections.abc import Iterator

import cloudpickle
import pytest

from tests.parallel import _user_models as um
from workbench.cluster import Cluster
from workbench.errors import ConfigError, ParallelError, RankError, UserCodeError
from workbench.trace import CommEvent, MemorySample, PhaseSpan
from workbench.ui.stepper import Stepper

# Ship the test's model by value, as a notebook's classes travel (engines need not import
# the tests package).
cloudpickle.register_pickle_by_value(um)

N_PARAMS = sum(p.numel() for p in um.make_model().parameters())


def _stepper(cluster: Cluster, **kw: object) -> Stepper:
    base: dict[str, object] = {
        "model": um.make_model,
        "data": um.make_data,
        "loss": um.lm_loss,
        "optimizer": um.adamw,
    }
    return Stepper(cluster=cluster, **{**base, **kw})  # type: ignore[arg-type]


@pytest.fixture
def fsdp(cluster: Cluster) -> Iterator[Stepper]:
    s = _stepper(cluster, strategy="fsdp")
    yield s
    s.close()


def test_user_model_steps_under_fsdp_like_a_builtin(fsdp: Stepper) -> None:
    new = fsdp.phase()
    assert {(e.rank, e.phase) for e in new if isinstance(e, PhaseSpan)} == {
        (0, "data"),
        (1, "data"),
    }
    fsdp.step()
    fsdp.run(2)
    assert [s.step for s in fsdp.status] == [3, 3]
    assert fsdp.session.last_recovery is None  # built once, never rebuilt between calls
    events = fsdp.events
    phases = Counter(e.phase for e in events if isinstance(e, PhaseSpan))
    assert phases == dict.fromkeys(["data", "forward", "backward", "sync", "optimizer"], 6)
    # Memory by category, exact: FSDP holds half of the fp32 parameters on each rank.
    start = [e for e in events if isinstance(e, MemorySample) and e.label == "start"]
    assert sum(m.params for m in start) >= 4 * N_PARAMS
    assert all(m.params <= 4 * N_PARAMS // 2 + 4 * 64 for m in start)  # + shard padding
    assert max(m.activations for m in events if isinstance(m, MemorySample)) > 0
    ops = {e.op for e in events if isinstance(e, CommEvent) and e.source == "fsdp"}
    assert {"all_gather", "reduce_scatter"} <= ops
    # Same numbers as one device on the same global batches.
    ref = fsdp.reference_losses()
    losses = [e.value for e in events if getattr(e, "name", "") == "loss" and e.rank == 0]
    assert len(ref) == 3 and max(abs(a - b) for a, b in zip(losses, ref, strict=True)) < 1e-5
    figures = fsdp.figures()
    assert set(figures) == {"memory", "comm", "loss"}


def test_ddp_params_bytes_are_the_users_parameter_count(cluster: Cluster) -> None:
    s = _stepper(cluster, strategy="dp")
    try:
        s.step()
        start = [e for e in s.events if isinstance(e, MemorySample) and e.label == "start"]
        assert [m.params for m in start] == [4 * N_PARAMS, 4 * N_PARAMS]
        after = [e for e in s.events if isinstance(e, MemorySample) and e.phase == "optimizer"]
        assert [m.optimizer for m in after] == [8 * N_PARAMS, 8 * N_PARAMS]  # AdamW m, v
        verdict = s.session.check_sharding()  # type: ignore[attr-defined]
        assert verdict["sharded"] and verdict["disjoint"] and verdict["complete"]
        assert verdict["per_dp_rank"] == {0: 64, 1: 64}
    finally:
        s.close()


def test_layout_by_dimension_and_user_tp_plan(cluster: Cluster) -> None:
    s = _stepper(cluster, tp=2, tp_plan=um.TP_PLAN)
    try:
        assert s.spec.strategy == "custom" and "tp=2" in repr(s.session)
        s.step()
        ops = {e.op for e in s.events if isinstance(e, CommEvent)}
        assert "all_reduce" in ops
        verdict = s.session.check_sharding()  # type: ignore[attr-defined]
        assert verdict["dp"] == 1 and verdict["same_within_dp_group"]
    finally:
        s.close()


def test_factory_named_on_the_engines(cluster: Cluster) -> None:
    cluster.execute(
        "import torch\n"
        "def engine_model():\n"
        "    return torch.nn.Sequential(torch.nn.Embedding(32, 8), torch.nn.Linear(8, 32))\n"
    )
    s = _stepper(cluster, model="engine_model", strategy="dp")
    try:
        assert s.spec.model == "engine_model"
        s.step()
        start = [e for e in s.events if isinstance(e, MemorySample) and e.label == "start"]
        assert start[0].params == 4 * (32 * 8 + 8 * 32 + 32)
    finally:
        s.close()


def _raises_on_rank1() -> object:
    import torch.distributed as dist

    if dist.get_rank() == 1:
        raise ValueError("bad hidden size 7")
    return um.make_model()


def test_factory_that_raises_names_rank_host_and_traceback(cluster: Cluster) -> None:
    s = _stepper(cluster, model=_raises_on_rank1, strategy="dp")
    with pytest.raises(RankError) as info:
        s.step()
    text = str(info.value)
    assert "model '_raises_on_rank1' raised ValueError: bad hidden size 7 on rank 1 (host" in text
    assert "in _raises_on_rank1" in text  # the user's own frame, from the engine


def test_unknown_engine_name_lists_the_nearest(cluster: Cluster) -> None:
    cluster.execute("def engine_model2():\n    pass\n")
    s = _stepper(cluster, model="engine_modl2", strategy="dp")
    with pytest.raises(RankError, match=r"'engine_modl2' is not defined on rank 0.*engine_model2"):
        s.step()


def test_what_cannot_run_fails_before_any_engine_works(cluster: Cluster) -> None:
    lock = threading.Lock()

    def holds_a_lock() -> object:
        with lock:
            return um.make_model()

    with pytest.raises(ConfigError, match=r"model=.*holds_a_lock cannot be shipped.*lock"):
        _stepper(cluster, model=holds_a_lock)
    with pytest.raises(
        ParallelError, match=r"'blocks\.\*\.attn\.qkv'.*nearest.*blocks\.\*\.attn\.q"
    ):
        _stepper(cluster, tp=2, tp_plan={"blocks.*.attn.qkv": "colwise"})
    with pytest.raises(ParallelError, match=r"tp\*pp = 3\*1 = 3 does not divide world_size=2"):
        _stepper(cluster, tp=3, tp_plan=um.TP_PLAN)
    with pytest.raises(ConfigError, match=r"needs loss= as well"):
        Stepper(cluster=cluster, model=um.make_model, data=um.make_data)
    with pytest.raises(ConfigError, match=r"unknown option 'overlapp'; did you mean 'overlap'"):
        _stepper(cluster, overlapp=True)
    assert UserCodeError.__mro__[1].__name__ == "WorkbenchError"


def _losses(stepper: Stepper) -> list[float]:
    return [
        e.value
        for e in stepper.events
        if getattr(e, "name", "") == "loss" and e.rank == 0  # type: ignore[attr-defined]
    ]


def test_user_model_checkpoint_save_load_in_a_fresh_session(
    cluster: Cluster, tmp_path: object
) -> None:
    """Saved after 2 steps, loaded into a fresh stepper (the same model under another
    layout), the run continues as the uninterrupted one; checkpoint_every autosaves."""
    whole = _stepper(cluster, strategy="fsdp")
    try:
        whole.run(4)
        expected = _losses(whole)
    finally:
        whole.close()
    first = _stepper(cluster, strategy="fsdp", checkpoint_dir=tmp_path, checkpoint_every=2)
    try:
        first.run(3)  # autosaves at step 2
        assert [c["step"] for c in first.checkpoints()] == [2]
        assert first.checkpoints()[0]["strategy"] == "user:fsdp"
    finally:
        first.close()
    second = _stepper(cluster, strategy="dp", checkpoint_dir=tmp_path)
    try:
        meta = second.load()
        assert meta["step"] == 2 and [s.step for s in second.status] == [2, 2]
        second.run(2)
        resumed = _losses(second)
        assert len(resumed) == 2
        assert max(abs(a - b) for a, b in zip(resumed, expected[2:], strict=True)) <= 1e-6
    finally:
        second.close()
