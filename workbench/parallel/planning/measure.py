"""Activation bytes of the user's model, measured from one traced forward at small scale.

The ``MemoryTracer``'s saved-tensor hooks count every distinct storage autograd keeps for
backward. A pre-hook and a hook on each repeated block (the largest ``ModuleList``) read
that count before and after the block, so each block's share is what it saved itself (its
input included: the previous block's output is saved by the next one's first op). The rest
of the peak (embedding, final norm, head, loss) is the edge. Dividing by the tokens of the
batch gives bytes per token per layer, the number the planner scales to a cluster.

With a sequence dimension the forward runs a second time on the first half of every
sequence: bytes per token that grow with the sequence mean the model keeps an s x s
attention tensor (math attention); bytes that do not, that it keeps none (SDPA's fused
CPU kernels, FlashAttention).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn
from torch.utils.data import Dataset, default_collate

from workbench.errors import ConfigError
from workbench.parallel.parallelize import fsdp_blocks
from workbench.trace.memory import MemoryTracer
from workbench.trace.recorder import Recorder

__all__ = ["ActivationMeasurement", "first_batch", "measure_activations"]

# Growth of bytes per token from s/2 to s above which the model keeps s x s scores.
_QUADRATIC = 0.01


@dataclass(frozen=True, slots=True)
class ActivationMeasurement:
    """One traced forward: bytes per layer and at the edges, for ``batch`` x ``seq``."""

    batch: int
    seq: int
    layers: int
    layer_bytes: float  # mean over blocks, for the whole batch
    edge_bytes: float  # embedding + head + loss, for the whole batch
    total_bytes: int  # peak of saved-for-backward bytes
    dtype_bytes: int
    dropout: bool
    half_layer_bytes: float | None = None  # the same at seq // 2 (None: not measured)

    @property
    def tokens(self) -> int:
        return self.batch * self.seq

    @property
    def layer_bytes_per_token(self) -> float:
        return self.layer_bytes / self.tokens

    @property
    def stores_scores(self) -> bool | None:
        """Whether per-token bytes grow with the sequence (None: not measured)."""
        if self.half_layer_bytes is None:
            return None
        half = self.half_layer_bytes / (self.batch * (self.seq // 2))
        return self.layer_bytes_per_token > half * (1 + _QUADRATIC)


def first_batch(data: Any, batch_size: int) -> Any:
    """The first batch of ``batch_size`` samples from the forms ``Stepper(data=...)`` takes:
    a Dataset, a callable returning one, or a callable returning batches."""
    if not isinstance(data, Dataset) and callable(data):
        try:
            data = data(0, 1)
        except TypeError:
            data = data()
    if isinstance(data, Dataset):
        n = len(data)  # type: ignore[arg-type]
        if n < 1:
            raise ConfigError("the dataset is empty: nothing to measure a step on")
        return default_collate([data[i] for i in range(min(batch_size, n))])
    try:
        return next(iter(data))
    except (TypeError, StopIteration):
        raise ConfigError(
            f"data gave {type(data).__name__}, not a Dataset or an iterable of batches"
        ) from None


def _split(batch: Any) -> tuple[Any, Any]:
    if isinstance(batch, torch.Tensor):
        return batch, None
    if isinstance(batch, tuple | list) and batch and isinstance(batch[0], torch.Tensor):
        return batch[0], batch[1] if len(batch) > 1 else None
    raise ConfigError(
        f"sample={type(batch).__name__} is not valid; give the inputs tensor or a tuple "
        "(inputs, targets)"
    )


def _dropout(model: nn.Module) -> bool:
    return any(isinstance(m, nn.Dropout) and m.p > 0 for m in model.modules()) and model.training


def _forward(
    model: nn.Module,
    inputs: torch.Tensor,
    targets: Any,
    loss: Callable[[Any, Any], torch.Tensor] | None,
    blocks: list[nn.Module],
) -> tuple[list[int], int]:
    """(bytes each block saved, peak saved bytes) of one forward (+ loss)."""
    tracer = MemoryTracer(model, None, Recorder(0))
    before: dict[int, int] = {}
    shares: list[int] = []
    handles = []
    for i, block in enumerate(blocks):
        handles.append(
            block.register_forward_pre_hook(
                lambda _m, _a, i=i: before.__setitem__(i, tracer.activation_bytes)
            )
        )
        handles.append(
            block.register_forward_hook(
                lambda _m, _a, _o, i=i: shares.append(tracer.activation_bytes - before[i])
            )
        )
    tracer.start()
    try:
        out = model(inputs)
        if loss is not None and targets is not None:
            out = loss(out, targets)
        # Saved tensors are freed only by backward or by dropping the graph, so the count
        # after the forward is its peak.
        total = tracer.activation_bytes
        del out  # frees the graph: nothing is kept past the measurement
    finally:
        tracer.stop()
        for handle in handles:
            handle.remove()
    return shares, total


def measure_activations(
    model: nn.Module,
    sample: Any,
    *,
    loss: Callable[[Any, Any], torch.Tensor] | None = None,
) -> ActivationMeasurement:
    """Saved-for-backward bytes of one forward of ``model`` on ``sample`` (and ``loss``)."""
    inputs, targets = _split(sample)
    # Copies, not views: a slice of a data set saved for backward would count the whole set.
    inputs = inputs.clone()
    targets = targets.clone() if isinstance(targets, torch.Tensor) else targets
    blocks = fsdp_blocks(model)
    if not blocks:
        raise ConfigError(
            f"{type(model).__name__} has no repeated blocks (an nn.ModuleList or "
            "nn.ModuleDict of layers); bytes per layer cannot be measured"
        )
    batch = int(inputs.shape[0]) if inputs.dim() >= 1 else 1
    seq = int(inputs.shape[1]) if inputs.dim() >= 2 else 1
    dtype = next((p.dtype for p in model.parameters() if p.is_floating_point()), torch.float32)
    shares, total = _forward(model, inputs, targets, loss, blocks)
    if len(shares) != len(blocks):
        raise ConfigError(
            f"the forward ran {len(shares)} of the model's {len(blocks)} blocks; bytes per "
            "layer are measured on a forward that runs every block once"
        )
    layer = sum(shares) / len(shares)
    half: float | None = None
    halvable = seq >= 4 and (
        targets is None
        or (isinstance(targets, torch.Tensor) and tuple(targets.shape[:2]) == (batch, seq))
    )
    if halvable:
        cut = seq // 2
        half_shares, _ = _forward(
            model,
            inputs[:, :cut].clone(),
            targets[:, :cut].clone() if targets is not None else None,
            loss,
            blocks,
        )
        half = sum(half_shares) / len(half_shares)
    return ActivationMeasurement(
        batch=batch,
        seq=seq,
        layers=len(blocks),
        layer_bytes=layer,
        edge_bytes=max(total - sum(shares), 0),
        total_bytes=total,
        dtype_bytes=torch.empty((), dtype=dtype).element_size(),
        dropout=_dropout(model),
        half_layer_bytes=half,
    )
