"""Local clusters on CUDA: ``backend="auto"`` picks NCCL with one GPU per engine, each engine
on ``cuda:LOCAL_RANK`` after the fork; DDP and FSDP steps on ``cuda:0`` against one device;
more engines than GPUs is a warning (auto: gloo) or one error (nccl), never NCCL's
"Duplicate GPU detected"."""

from __future__ import annotations

import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psutil
import pytest

from benchmarks.gpu_results import nvidia_smi
from tests.gpu.conftest import gpu_count
from workbench.cluster import Cluster
from workbench.errors import ConfigError

ROOT = str(Path(__file__).resolve().parents[2])


def _cuda_facts() -> dict[str, Any]:
    import os

    import torch
    import torch.distributed as dist

    local = int(os.environ["LOCAL_RANK"])
    t = torch.full((1 << 20,), float(dist.get_rank() + 1), device=f"cuda:{local}")
    dist.all_reduce(t)
    return {
        "backend": dist.get_backend(),
        "local_rank": local,
        "current_device": torch.cuda.current_device(),
        "initialized": torch.cuda.is_initialized(),
        "bad_fork": torch.cuda._is_in_bad_fork(),
        "sum": float(t[0]),
        "pid": os.getpid(),
        "forker_pid": os.getppid(),
    }


def _ddp_and_fsdp_against_one_device(root: str, device: str = "cuda:0") -> dict[str, Any]:
    import sys

    sys.path.insert(0, root)  # the test's own helpers (the engines run from the package)
    import torch
    from torch.distributed.device_mesh import init_device_mesh

    from tests.gpu._gpt import SMALL, full_params, gpt_step
    from workbench.parallel.dp import apply_dp
    from workbench.parallel.fsdp import apply_fsdp

    mesh = init_device_mesh(torch.device(device).type, (1,), mesh_dim_names=("dp",))
    ref = gpt_step(SMALL, device)
    ref_losses = [ref.run_step() for _ in range(3)]
    ref_params = full_params(ref.model)
    ref.close()
    out: dict[str, Any] = {"single_losses": ref_losses}
    wraps = {"dp": lambda m: apply_dp(m, mesh), "fsdp": lambda m: apply_fsdp(m, mesh)}
    for name, wrap in wraps.items():
        step = gpt_step(SMALL, device, wrap=wrap, strategy=name)
        losses = [step.run_step() for _ in range(3)]
        params = full_params(step.model)
        out[name] = {
            "wrapper": type(step.model).__name__,
            "devices": sorted({str(p.device) for p in step.model.parameters()}),
            "losses": losses,
            "max_dparam": max((params[k] - v).abs().max().item() for k, v in ref_params.items()),
        }
        step.close()
    return out


@pytest.fixture(scope="module")
def one_gpu_cluster() -> Iterator[Cluster]:
    cluster = Cluster(n=1)  # backend="auto"
    cluster.start_sync()
    try:
        yield cluster
    finally:
        cluster.stop_sync()


def _compute_pids() -> set[int] | None:
    """Processes holding a CUDA context, by nvidia-smi (None where it cannot say)."""
    out = nvidia_smi("--query-compute-apps=pid", "--format=csv,noheader")
    return None if out is None else {int(w) for w in out.split() if w.isdigit()}


def test_auto_is_nccl_on_cuda_local_rank_after_the_fork(
    one_gpu_cluster: Cluster, numbers: dict[str, Any]
) -> None:
    assert one_gpu_cluster.backend == "nccl"
    assert [r.device for r in one_gpu_cluster.ranks] == ["cuda:0"]
    [facts] = one_gpu_cluster.run(_cuda_facts)
    apps = _compute_pids()
    numbers.update(facts, compute_pids=sorted(apps) if apps is not None else "unknown")
    assert facts["backend"] == "nccl" and facts["sum"] == 1.0
    assert facts["current_device"] == facts["local_rank"] == 0
    assert facts["initialized"] and not facts["bad_fork"]
    if apps is not None and facts["pid"] in apps:  # nvidia-smi sees this pid namespace
        assert facts["forker_pid"] not in apps, "the forker holds a CUDA context"


def test_ddp_and_fsdp_steps_on_cuda0_match_one_device(
    one_gpu_cluster: Cluster, numbers: dict[str, Any]
) -> None:
    [out] = one_gpu_cluster.run(_ddp_and_fsdp_against_one_device, ROOT)
    numbers.update(
        dp_max_dparam=out["dp"]["max_dparam"],
        fsdp_max_dparam=out["fsdp"]["max_dparam"],
        dp_wrapper=out["dp"]["wrapper"],
        fsdp_wrapper=out["fsdp"]["wrapper"],
    )
    for name in ("dp", "fsdp"):
        assert out[name]["devices"] == ["cuda:0"]
        assert out[name]["max_dparam"] <= 1e-5
    assert out["dp"]["wrapper"] == "DistributedDataParallel"


def _gloo_facts() -> dict[str, Any]:
    import torch
    import torch.distributed as dist

    t = torch.ones(4)
    dist.all_reduce(t)
    facts: dict[str, Any] = {"backend": dist.get_backend(), "cpu_sum": float(t[0])}
    try:  # gloo can also reduce CUDA tensors (through host memory)
        c = torch.ones(4, device="cuda:0")
        dist.all_reduce(c)
        facts["cuda_sum"] = float(c[0])
    except Exception as e:
        facts["cuda_error"] = f"{type(e).__name__}: {e}"[:200]
    return facts


def test_more_engines_than_gpus_with_auto_is_gloo_said_at_once(numbers: dict[str, Any]) -> None:
    n = gpu_count() + 1
    with pytest.warns(UserWarning, match=f"backend='auto' chose gloo on CPU: n={n}"):
        cluster = Cluster(n=n)
    cluster.start_sync()
    try:
        assert cluster.backend == "gloo"
        assert {r.device for r in cluster.ranks} == {"cpu"}
        facts = cluster.run(_gloo_facts)
    finally:
        cluster.stop_sync()
    numbers.update(facts[0], n=n)
    assert [f["cpu_sum"] for f in facts] == [float(n)] * n


def test_more_engines_than_gpus_with_nccl_is_one_error_before_any_process() -> None:
    n = gpu_count() + 1
    before = {p.pid for p in psutil.Process().children(recursive=True)}
    with warnings.catch_warnings(), pytest.raises(ConfigError) as info:
        warnings.simplefilter("error")
        Cluster(n=n, backend="nccl")
    assert f"n={n} local engines, but this host has {gpu_count()} CUDA device" in str(info.value)
    assert "Duplicate GPU" not in str(info.value)
    assert {p.pid for p in psutil.Process().children(recursive=True)} == before
