"""The parallelism lab on CUDA (issues 46 and 48): a multi-stage pipeline schedule (ZB-V: two
stages on the rank, split backward) and the context-parallel ring attention on ``cuda:0``,
each against the same model on one device. One engine (NCCL, one GPU), as the other GPU
checks run."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from workbench.cluster import Cluster

ROOT = str(Path(__file__).resolve().parents[2])


def _lab_on_device(root: str, device: str = "cuda:0") -> dict[str, Any]:
    """Pipeline (zbv, 2 local stages, 4 micro-batches) and ring attention on ``device``:
    the largest |difference| from the plain model's gradients and output."""
    import sys

    sys.path.insert(0, root)
    import torch
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh

    from workbench.parallel.cp import ContextShard, ring_attention
    from workbench.parallel.models import build_model, get_config, loss_fn_for
    from workbench.parallel.pp import apply_pp

    dev = torch.device(device)
    config = get_config("gpt-small")
    loss_fn = loss_fn_for(config)
    torch.manual_seed(0)
    x = torch.randint(0, config.vocab, (8, config.seq_len), device=dev)
    y = torch.randint(0, config.vocab, (8, config.seq_len), device=dev)

    ref = build_model(config).to(dev)
    loss_fn(ref(x), y).backward()
    ref_grads = {n: p.grad for n, p in ref.named_parameters()}

    mesh = init_device_mesh(dev.type, (1,), mesh_dim_names=("pp",))
    pipe = apply_pp(
        build_model(config).to(dev), mesh, loss_fn=loss_fn, microbatches=4, schedule="zbv"
    )
    pipe.run(x, y)
    pipe.sync_tied()
    grads = {n: p.grad for n, p in pipe.stage_module.named_parameters()}
    # the last stage's copy of the tied embedding: summed with the first's by sync_tied
    tied_copy = grads.pop("head.weight")
    pp_diff = max(float((grads[n] - ref_grads[n]).abs().max()) for n in grads)
    pp_diff = max(pp_diff, float((tied_copy - ref_grads["tok_emb.weight"]).abs().max()))

    q, k, v = (torch.randn(2, 4, 64, 32, device=dev) for _ in range(3))
    mask = torch.ones(64, 64, dtype=torch.bool, device=dev).triu(1)
    scores = (q @ k.transpose(-2, -1)) / 32**0.5
    plain = scores.masked_fill(mask, float("-inf")).softmax(-1) @ v
    ring = ring_attention(q, k, v, ContextShard.of(dist.group.WORLD))
    return {
        "pp_max_dgrad": pp_diff,
        "pp_params": sorted(grads) == sorted(ref_grads) and len(pipe.stages),
        "cp_max_dout": float((ring - plain).abs().max()),
        "devices": sorted({str(p.device) for p in pipe.parameters()}),
    }


@pytest.fixture(scope="module")
def one_gpu_cluster() -> Iterator[Cluster]:
    cluster = Cluster(n=1)  # backend="auto": NCCL on cuda:0
    cluster.start_sync()
    try:
        yield cluster
    finally:
        cluster.stop_sync()


def test_zbv_pipeline_and_ring_attention_on_cuda(
    one_gpu_cluster: Cluster, numbers: dict[str, Any]
) -> None:
    [out] = one_gpu_cluster.run(_lab_on_device, ROOT)
    numbers.update(out)
    assert out["devices"] == ["cuda:0"]
    assert out["pp_params"] == 2  # both stages of the V on this rank, every parameter
    assert out["pp_max_dgrad"] <= 1e-5
    assert out["cp_max_dout"] <= 1e-5
