"""Data sharding, synthetic data, models and options on one process."""

from __future__ import annotations

import math

import pytest
import torch

from workbench.parallel import (
    GPT,
    PRESETS,
    RunSpec,
    build_model,
    build_train_step,
    full_state_dict,
    get_config,
    make_dataset,
    make_loader,
    rank_indices,
)
from workbench.parallel.options import apply_checkpointing


@pytest.mark.parametrize("world", [1, 2, 3, 4])
def test_rank_indices_disjoint_complete_reshuffled(world: int) -> None:
    n = 24
    epoch0 = rank_indices(n, world, epoch=0, seed=5)
    epoch1 = rank_indices(n, world, epoch=1, seed=5)
    for shards in (epoch0, epoch1):
        flat = [i for shard in shards for i in shard]
        assert len(flat) == len(set(flat)) == n  # disjoint and complete (n divisible)
        assert len({len(s) for s in shards}) == 1
    assert epoch0 != epoch1  # a new permutation each epoch
    assert rank_indices(n, world, epoch=0, seed=5) == epoch0  # and deterministic


def test_rank_batches_union_is_the_single_device_batch() -> None:
    config = get_config("mlp-tiny")
    data = make_dataset(config, 64)
    single = iter(make_loader(data, 8, num_replicas=1, rank=0, seed=3))
    ranks = [iter(make_loader(data, 4, num_replicas=2, rank=r, seed=3)) for r in range(2)]
    for _ in range(8):
        x_single = next(single)[0]
        x_ranks = torch.cat([next(it)[0] for it in ranks])
        key = lambda t: sorted(map(tuple, t.tolist()))  # noqa: E731 - order within a batch is free
        assert key(x_single) == key(x_ranks)


def test_token_stream_is_learnable() -> None:
    config = get_config("gpt-tiny")
    x, y = make_dataset(config, 256).tensors
    pairs = torch.stack([x.flatten(), y.flatten()], 1)
    counts = torch.zeros(config.vocab, config.vocab)
    counts.index_put_((pairs[:, 0], pairs[:, 1]), torch.ones(len(pairs)), accumulate=True)
    p = counts / counts.sum(1, keepdim=True).clamp(min=1)
    weights = counts.sum(1) / counts.sum()
    entropy = -(weights[:, None] * p * p.clamp(min=1e-12).log()).sum()
    assert entropy < 0.6 * math.log(config.vocab)  # far from uniform: there is structure


def test_models_are_deterministic_from_seed() -> None:
    for name in PRESETS:
        a = dict(build_model(get_config(name, seed=1)).named_parameters())
        b = dict(build_model(get_config(name, seed=1)).named_parameters())
        c = dict(build_model(get_config(name, seed=2)).named_parameters())
        assert all(torch.equal(a[k], b[k]) for k in a)
        assert any(not torch.equal(a[k], c[k]) for k in a)


def test_gpt_is_causal_and_tied() -> None:
    model = build_model(get_config("gpt-tiny"))
    assert isinstance(model, GPT) and model.head.weight is model.tok_emb.weight
    x = torch.randint(0, 64, (2, 16))
    x2 = x.clone()
    x2[:, 10:] = (x2[:, 10:] + 1) % 64
    out, out2 = model(x), model(x2)
    assert torch.equal(out[:, :10], out2[:, :10])
    assert not torch.equal(out[:, 10:], out2[:, 10:])


@pytest.mark.parametrize("model", ["gpt-tiny", "mlp-tiny"])
def test_checkpointing_does_not_change_numbers(model: str) -> None:
    runs = []
    for checkpointing in (False, True):
        step = build_train_step(
            RunSpec(model=model, strategy="single", checkpointing=checkpointing, trace=False)
        )
        runs.append(([step.run_step() for _ in range(5)], full_state_dict(step)))
    (l0, p0), (l1, p1) = runs
    assert l0 == l1
    assert p0 is not None and p1 is not None
    assert all(torch.equal(p0[k], p1[k]) for k in p0)


def test_checkpointing_recomputes_in_backward() -> None:
    model = build_model(get_config("gpt-tiny"))
    assert apply_checkpointing(model) == 2
    calls = []
    model.layers["0"].attn.register_forward_hook(lambda *_: calls.append(1))
    model(torch.randint(0, 64, (2, 16))).sum().backward()
    assert len(calls) == 2  # forward once, recomputed once in backward


def test_grad_accumulation_matches_one_pass() -> None:
    runs = []
    for accum in (1, 4):
        step = build_train_step(
            RunSpec(model="mlp-tiny", strategy="single", grad_accum=accum, trace=False)
        )
        runs.append(([step.run_step() for _ in range(5)], full_state_dict(step)))
    (l1, p1), (l4, p4) = runs
    assert max(abs(a - b) for a, b in zip(l1, l4, strict=True)) <= 1e-6
    assert p1 is not None and p4 is not None
    assert max(float((p1[k] - p4[k]).abs().max()) for k in p1) <= 1e-5
