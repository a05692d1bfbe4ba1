"""Synthetic data made locally, and how a data-parallel run shards it.

- GPT: a token stream from a fixed random Markov chain in which every token has a few
  likely successors, so a model can learn it (the loss falls well below log(vocab)).
- MLP: regression onto a fixed random two-layer teacher network plus a little noise.

Sharding uses ``DistributedSampler``: each epoch one permutation of all indices (seeded by
``seed + epoch``) is dealt round-robin to the ranks, so the ranks' sets are disjoint and
together complete, and they change every epoch. With the global batch ``B`` split into
``B / n`` per rank, the union of the ranks' batches at step ``i`` is exactly the batch a
single device takes at step ``i`` (positions ``i*B .. (i+1)*B`` of the same permutation):
the property the equivalence tests rely on.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterator

import torch
from torch.utils.data import DataLoader, Dataset, DistributedSampler, TensorDataset

from workbench.errors import ConfigError
from workbench.parallel.models import GPTConfig, ModelConfig

__all__ = [
    "batches",
    "make_dataset",
    "make_loader",
    "rank_indices",
    "synthetic_regression",
    "synthetic_tokens",
]


def synthetic_tokens(config: GPTConfig, n_samples: int, *, seed: int = 0) -> TensorDataset:
    """``n_samples`` windows (inputs, next-token targets) of a learnable Markov stream."""
    g = torch.Generator().manual_seed(seed + 1)
    v = config.vocab
    successors = torch.randint(0, v, (v, 4), generator=g)  # each token's 4 likely successors
    length = n_samples * config.seq_len + 1
    stream = torch.empty(length, dtype=torch.long)
    stream[0] = 0
    choice = torch.randint(0, 4, (length,), generator=g)
    noise = torch.rand(length, generator=g) < 0.1
    random_tokens = torch.randint(0, v, (length,), generator=g)
    for i in range(1, length):
        prev = int(stream[i - 1])
        stream[i] = random_tokens[i] if noise[i] else successors[prev, choice[i]]
    windows = stream[:-1].view(n_samples, config.seq_len)
    targets = stream[1:].view(n_samples, config.seq_len)
    return TensorDataset(windows, targets)


def synthetic_regression(config: ModelConfig, n_samples: int, *, seed: int = 0) -> TensorDataset:
    """``n_samples`` pairs ``(x, tanh(x W1) W2 + 0.01 noise)`` for a fixed random teacher."""
    g = torch.Generator().manual_seed(seed + 1)
    d_in, d_out = config.d_in, config.d_out  # type: ignore[union-attr]
    w1 = torch.randn(d_in, 2 * d_in, generator=g) / d_in**0.5
    w2 = torch.randn(2 * d_in, d_out, generator=g) / (2 * d_in) ** 0.5
    x = torch.randn(n_samples, d_in, generator=g)
    y = torch.tanh(x @ w1) @ w2 + 0.01 * torch.randn(n_samples, d_out, generator=g)
    return TensorDataset(x, y)


def make_dataset(config: ModelConfig, n_samples: int, *, seed: int = 0) -> TensorDataset:
    """The synthetic data set that fits ``config``'s model."""
    if isinstance(config, GPTConfig):
        return synthetic_tokens(config, n_samples, seed=seed)
    return synthetic_regression(config, n_samples, seed=seed)


def make_loader(
    dataset: Dataset,
    batch_size: int,
    *,
    num_replicas: int = 1,
    rank: int = 0,
    seed: int = 0,
    shuffle: bool = True,
) -> DataLoader:
    """A loader over this rank's shard; ``batch_size`` is per rank. Call
    ``loader.sampler.set_epoch(e)`` each epoch (``batches`` does) to reshuffle."""
    if batch_size < 1:
        raise ConfigError(f"batch_size={batch_size!r} must be >= 1")
    if not 0 <= rank < num_replicas:
        raise ConfigError(f"rank={rank!r} is not valid; choose from 0..{num_replicas - 1}")
    sampler = DistributedSampler(
        dataset, num_replicas=num_replicas, rank=rank, shuffle=shuffle, seed=seed, drop_last=True
    )
    # A loader of its own generator: without one, each new iterator (every epoch, and
    # the first after a checkpoint load) draws its base seed from the global torch
    # generator, shifting the run's dropout masks by one draw — a resumed run would then
    # not equal the uninterrupted one.
    generator = torch.Generator().manual_seed(seed)
    return DataLoader(
        dataset, batch_size=batch_size, sampler=sampler, drop_last=True, generator=generator
    )


def batches(loader: DataLoader, start: int = 0) -> Iterator[tuple[torch.Tensor, ...]]:
    """Endless batches; a new epoch (with a new shuffle) starts when the loader runs out.

    ``start`` resumes at that many batches already taken (a checkpoint's data position):
    the order is a pure function of seed and epoch, so epoch ``start // len(loader)`` is
    re-shuffled the same way and its first ``start % len(loader)`` batches are skipped.
    """
    if isinstance(start, bool) or not isinstance(start, int) or start < 0:
        raise ConfigError(f"start={start!r} is not valid; it must be an integer >= 0")
    per_epoch = len(loader)
    if per_epoch == 0:
        raise ConfigError("the loader yields no batches; use a smaller batch_size")
    epoch, skip = divmod(start, per_epoch)
    while True:
        sampler = loader.sampler
        if isinstance(sampler, DistributedSampler):
            sampler.set_epoch(epoch)
        if skip:
            yield from itertools.islice(loader, skip, None)
            skip = 0
        else:
            yield from loader
        epoch += 1


def rank_indices(
    n_samples: int, num_replicas: int, *, epoch: int = 0, seed: int = 0, shuffle: bool = True
) -> list[list[int]]:
    """Which sample indices each rank sees in ``epoch`` (no process group needed)."""
    if num_replicas < 1:
        raise ConfigError(f"num_replicas={num_replicas!r} must be >= 1")
    dataset = range(n_samples)
    out: list[list[int]] = []
    for rank in range(num_replicas):
        sampler = DistributedSampler(
            dataset,  # type: ignore[arg-type]
            num_replicas=num_replicas,
            rank=rank,
            shuffle=shuffle,
            seed=seed,
            drop_last=True,
        )
        sampler.set_epoch(epoch)
        out.append(list(sampler))
    return out
