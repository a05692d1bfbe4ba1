"""ZeRO-3 module by module, as DeepSpeed first ran it (``zero3_prefetch='module'``).

DeepSpeed's ZeRO-3 as released in v0.3.13 (March 2021; deepspeed/runtime/zero/stage3.py
and partition_parameters.py, commit 311795d0), with its documented defaults, fetches the
weights of one sub-module (a Linear) at a time from hooks around each sub-module:

- prefetch: after fetching a sub-module's weights, the next not-yet-gathered weights in the
  recorded trace are gathered asynchronously until they reach ``stage3_prefetch_bucket_size``
  (5e7 parameters), and only when nothing else is in flight (``prefetch_next_sub_modules``).
  A weight matrix of a large model is bigger than the bucket, so a gather runs one
  sub-module ahead, behind the compute issued since the previous gather was waited for;
- synchronization: ``_allgather_param`` calls ``torch.cuda.synchronize()`` before every
  gather and ``_synchronize_communication`` after waiting for one, so the device is idle at
  each sub-module boundary where a gather starts or ends. The gradient reduce-scatter
  (one per parameter, ``_reduce_scatter_gradients``, in the gradients' 2-byte dtype) is
  drained by those synchronizations and shares the link with the next gather in flight:
  it is counted as never hidden (an upper bound on its exposed time);
- reuse: after a sub-module runs, its weights stay gathered only if the parameters used
  before its next use number fewer than ``stage3_max_reuse_distance`` (1e9). Under full
  recompute the recompute forward and the backward of a layer are the uses that can be
  close: for a GPT-3-sized layer only the last Linear stays, the others are gathered again
  for the backward (3 gathers of most weights per step, not 2);
- live weights: a prefetch is issued only while the gathered weights kept resident number
  fewer than ``stage3_max_live_parameters`` (1e9); past that, the next weights are
  gathered when needed, not hidden.

A transformer layer is modelled as Megatron's four Linears in forward order (fused QKV,
attention output, MLP up (gate and up fused when gated), MLP down); norms and biases are
below ``stage3_param_persistence_threshold`` (1e5) and never gathered. Each Linear's share
of the layer's compute is its share of the layer's weights. The embedding and the head
are units of their own (a tied head is the embedding's unit). One micro-batch's trace
(forward, then per layer the recompute forward and the backward) is walked as the device
would run it.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import TYPE_CHECKING

from workbench.planner.comm import all_gather_time
from workbench.planner.params import count_params, stage_params
from workbench.planner.specs import LinkSpec, ModelSpec, StepInputs

if TYPE_CHECKING:  # comm_time calls this module for zero3_prefetch='module'
    from workbench.planner.compute_time import Compute

__all__ = [
    "MAX_LIVE_PARAMETERS",
    "MAX_REUSE_DISTANCE",
    "PREFETCH_BUCKET",
    "layer_linears",
    "module_dp_time",
]

# DeepSpeed v0.3.13 defaults (deepspeed/runtime/zero/constants.py).
PREFETCH_BUCKET = 50_000_000  # ZERO_OPTIMIZATION_PREFETCH_BUCKET_SIZE_DEFAULT
MAX_REUSE_DISTANCE = 1_000_000_000  # ZERO_OPTIMIZATION_MAX_REUSE_DISTANCE_DEFAULT
MAX_LIVE_PARAMETERS = 1_000_000_000  # ZERO_OPTIMIZATION_MAX_LIVE_PARAMETERS_DEFAULT


@dataclass(slots=True)
class _Use:
    """One sub-module call in the trace: which weights, how many, the compute it issues."""

    unit: int
    params: int
    compute: float
    gathered: bool = True  # False: still resident from an earlier use (reuse distance)
    kept_until: int | None = None  # the later use that finds these weights resident


def layer_linears(model: ModelSpec, tp: int = 1) -> tuple[int, ...]:
    """Parameters of a layer's Linear weights on one TP rank, in forward order."""
    h, kv, f = model.hidden, model.kv_hidden, model.ffn_size
    up = (2 if model.gated_mlp else 1) * h * f
    return (h * (h + 2 * kv) // tp, h * h // tp, up // tp, f * h // tp)


@dataclass(frozen=True, slots=True)
class _Edges:
    """The weights outside the layers a rank gathers: the embedding (and positions) at
    the start of the forward, the head at its end; a tied head is the embedding's unit."""

    embedding: int
    head: int
    tied: bool


def _edges(step: StepInputs, work: Compute) -> _Edges:
    """The busiest rank's edge weights: with one pipeline stage both ends; with several,
    what the busiest stage holds beyond its layers, counted as a head."""
    model, parallel = step.model, step.parallel
    c = count_params(model)
    vtp = parallel.tp if parallel.vocab_parallel else 1
    if parallel.pp == 1:
        return _Edges(c.embedding // vtp + c.positions, c.head // vtp, tied=c.head == 0)
    n_rank = max(stage_params(model, parallel.tp, work.layout, vocab_parallel=vtp > 1))
    rest = n_rank - max(work.layout) * sum(layer_linears(model, parallel.tp))
    return _Edges(0, max(0, rest), tied=False)


def _trace(step: StepInputs, work: Compute, edges: _Edges) -> list[_Use]:
    """One micro-batch on the busiest stage: the embedding, the layers' forward and the
    head, then the head's backward, per layer from the last the recompute forward (under
    full recompute) and the backward, and the embedding's backward."""
    linears = layer_linears(step.model, step.parallel.tp)
    layers, k = max(work.layout), len(linears)
    recompute = step.training.recompute == "full"
    fwd_share = work.fwd_micro / work.per_micro
    layer_time = (work.per_micro - work.head_micro) / layers
    fwd = layer_time * fwd_share
    bwd = layer_time - fwd * (2 if recompute else 1)
    share = [p / sum(linears) for p in linears]

    def calls(layer: int, seconds: float, order: range) -> list[_Use]:
        return [_Use(layer * k + j, linears[j], seconds * share[j]) for j in order]

    embed, head = layers * k, layers * k + 1
    head_unit, head_params = (embed, edges.embedding) if edges.tied else (head, edges.head)
    head_fwd = work.head_micro * fwd_share
    uses = [_Use(embed, edges.embedding, 0.0)]
    uses += [u for i in range(layers) for u in calls(i, fwd, range(k))]
    uses += [_Use(head_unit, head_params, head_fwd)]
    uses += [_Use(head_unit, head_params, work.head_micro - head_fwd)]
    for i in reversed(range(layers)):
        if recompute:
            uses += calls(i, fwd, range(k))
        uses += calls(i, bwd, range(k - 1, -1, -1))
    uses += [_Use(embed, edges.embedding, 0.0)]
    return [u for u in _mark_reuse(uses) if u.params]


def _mark_reuse(uses: list[_Use]) -> list[_Use]:
    """A use whose unit was last used within MAX_REUSE_DISTANCE parameters finds its
    weights resident (``stage3_max_reuse_distance``); the earlier use keeps them. Returns
    the uses so marked (new records; ``uses`` is left as it was)."""
    last: dict[int, int] = {}
    before = [0]  # before[i] = parameters of uses[0:i]
    for use in uses:
        before.append(before[-1] + use.params)
    gathered = [use.gathered for use in uses]
    kept_until = [use.kept_until for use in uses]
    for i, use in enumerate(uses):
        j = last.get(use.unit)
        if j is not None and before[i] - before[j + 1] < MAX_REUSE_DISTANCE:
            gathered[i] = False
            kept_until[j] = i
        last[use.unit] = i
    return [
        replace(use, gathered=g, kept_until=k)
        for use, g, k in zip(uses, gathered, kept_until, strict=True)
    ]


def _walk(uses: list[_Use], gather: dict[int, float]) -> tuple[float, float]:
    """(seconds one micro-batch takes, seconds of gathers in it), walking the trace with
    one prefetch in flight at a time and the device synchronized around each gather."""
    compute_end = 0.0  # when the compute issued so far is done
    in_flight: tuple[float, set[int]] | None = None  # (when it lands, the uses it brings)
    ready: set[int] = set()
    gathered = 0.0
    kept = 0  # parameters resident for a later reuse (not counting the current use)
    releases: dict[int, int] = {}
    for i, use in enumerate(uses):
        kept -= releases.pop(i, 0)
        if use.gathered:
            if in_flight is not None and i in in_flight[1]:
                compute_end = max(compute_end, in_flight[0])
                ready |= in_flight[1]
                in_flight = None
            elif i not in ready:  # gathered on demand: not hidden
                compute_end += gather[use.params]
                gathered += gather[use.params]
        if in_flight is None and use.params + kept < MAX_LIVE_PARAMETERS:
            batch = _next_batch(uses, i, ready)
            if batch:
                seconds = sum(gather[uses[j].params] for j in batch)
                in_flight = (compute_end + seconds, batch)  # starts after a synchronize
                gathered += seconds
        compute_end += use.compute
        if use.kept_until is not None:
            kept += use.params
            releases[use.kept_until] = releases.get(use.kept_until, 0) + use.params
    return compute_end, gathered


def _next_batch(uses: list[_Use], i: int, ready: set[int]) -> set[int]:
    """The next uses to gather after i, up to the prefetch bucket (at least one)."""
    batch: set[int] = set()
    numel = 0
    for j in range(i + 1, len(uses)):
        if uses[j].gathered and j not in ready and uses[j].params:
            batch.add(j)
            numel += uses[j].params
            if numel >= PREFETCH_BUCKET:
                break
    return batch


def module_dp_time(step: StepInputs, work: Compute, link: LinkSpec) -> tuple[float, float]:
    """ZeRO-3 as DeepSpeed v0.3.13 ran it: (seconds of communication, seconds of it not
    hidden behind compute) over a step of ``step.m`` micro-batches."""
    group, training = step.parallel.grad_group, step.training
    linears = layer_linears(step.model, step.parallel.tp)
    edges = _edges(step, work)
    uses = _trace(step, work, edges)
    gather = {
        p: all_gather_time(p * training.dtype_bytes, group, link) for p in {u.params for u in uses}
    }
    seconds, gathered = _walk(uses, gather)
    # One reduce-scatter per parameter, never hidden (see the module docstring).
    grad = training.trainable * training.grad_comm_bytes
    weights = [*linears * max(work.layout), edges.embedding, 0 if edges.tied else edges.head]
    rs = sum(all_gather_time(p * grad, group, link) for p in weights if p)
    syncs = 1 if training.grad_sync == "per_step" else step.m
    exposed = step.m * max(0.0, seconds - work.per_micro) + syncs * rs
    return step.m * gathered + syncs * rs, exposed
