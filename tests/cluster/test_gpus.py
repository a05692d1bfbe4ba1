"""More local engines than GPUs, decided before any process starts (GPU counts faked here;
tests/gpu/ checks the same on a real GPU)."""

from __future__ import annotations

import warnings

import pytest

from workbench.cluster import Cluster
from workbench.cluster.hosts import gpus
from workbench.cluster.hosts.gpus import gpu_choice, visible_gpu_count
from workbench.errors import ConfigError


@pytest.mark.parametrize(
    ("spec", "physical", "visible"),
    [
        (None, 2, 2),
        ("", 2, 0),
        ("-1", 2, 0),
        ("1", 2, 1),
        ("0,1", 1, 1),  # device 1 does not exist on a 1-GPU host: the list ends there
        ("0,-1,1", 2, 1),
        ("1,1", 2, 1),  # a repeat ends the list
        ("GPU-8a1f,GPU-77c2", 2, 2),
        ("0, 1", 4, 2),
        ("abc", 2, 0),
    ],
)
def test_cuda_visible_devices_is_read_as_cuda_reads_it(
    spec: str | None, physical: int, visible: int
) -> None:
    env = {} if spec is None else {"CUDA_VISIBLE_DEVICES": spec}
    assert visible_gpu_count(env, physical=physical) == visible


def test_enough_gpus_or_none_needs_no_word() -> None:
    assert gpu_choice(1, "nccl", 1) is None
    assert gpu_choice(2, "auto", 2) is None
    assert gpu_choice(2, "auto", 0) is None  # a CPU host: gloo, as always
    assert gpu_choice(2, "gloo", 1) is None


def test_nccl_with_more_engines_than_gpus_names_both_counts() -> None:
    with pytest.raises(ConfigError) as info:
        gpu_choice(2, "nccl", 1)
    message = str(info.value)
    assert message.startswith("backend='nccl' is not valid: n=2 local engines")
    assert "this host has 1 CUDA device " in message
    assert "use n <= 1 for NCCL, or backend='gloo'" in message
    with pytest.raises(ConfigError, match="has no CUDA device .*; use backend='gloo'"):
        gpu_choice(1, "nccl", 0)


def test_auto_with_more_engines_than_gpus_says_it_chose_gloo() -> None:
    notice = gpu_choice(3, "auto", 2)
    assert notice is not None
    assert notice.startswith("backend='auto' chose gloo on CPU: n=3 local engines")
    assert "2 CUDA devices" in notice and "n <= 2 gives NCCL" in notice


def _fake_gpus(monkeypatch: pytest.MonkeyPatch, count: int) -> None:
    monkeypatch.setattr(gpus, "visible_gpu_count", lambda: count)


def test_cluster_refuses_nccl_before_any_process_starts(monkeypatch: pytest.MonkeyPatch) -> None:
    # The unit tier refuses every process start: this raising ConfigError (not that) shows
    # the check runs at construction, before the controller or an engine exists.
    _fake_gpus(monkeypatch, 1)
    with pytest.raises(ConfigError, match="n=2 local engines, but this host has 1 CUDA"):
        Cluster(n=2, backend="nccl")
    Cluster(n=1, backend="nccl")  # one engine per GPU: fine


def test_cluster_warns_when_auto_falls_back_to_gloo(monkeypatch: pytest.MonkeyPatch) -> None:
    _fake_gpus(monkeypatch, 1)
    with pytest.warns(UserWarning, match="backend='auto' chose gloo on CPU: n=2") as seen:
        cluster = Cluster(n=2)
    assert cluster.gpu_notice == str(seen[0].message)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert Cluster(n=1).gpu_notice is None


def test_a_cluster_on_other_hosts_is_not_judged_by_this_hosts_gpus(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    _fake_gpus(monkeypatch, 0)
    cluster = Cluster(n=4, backend="nccl", launcher="ssh", hosts=["node-a", "node-b"])
    assert cluster.gpu_notice is None
