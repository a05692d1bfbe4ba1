# %% [markdown]
# # 03 · Tensor parallel: splitting the layers themselves
#
# Data parallelism (notebook 02) copies the whole model to every rank. When one layer's
# weights, or one layer's matrix multiplications, are too big for one device, the
# matrices themselves must be split: **tensor parallelism** (TP). Each rank holds a slice
# of every weight matrix and computes a slice of every product; the ranks exchange
# *activations* inside every layer to stitch the slices together.
#
# This notebook builds the Megatron-LM split of a feed-forward block by hand, finds its
# two all-reduces (the operators Megatron calls *f* and *g*), then runs the whole GPT both
# with that hand-written split and with PyTorch's DTensor, and measures what each rank
# holds.

# %%
%load_ext workbench

# %%
%wb start -n 2

# %% [markdown]
# ## 1. The Megatron split of one feed-forward block, by hand
#
# A transformer's feed-forward block is `fc2(gelu(fc1(x)))`. Megatron splits it so the
# non-linearity never needs the full tensor:
#
# - `fc1` is **column-parallel**: each rank keeps a slice of its *output* features, so
#   `gelu` runs on the local slice;
# - `fc2` is **row-parallel**: each rank keeps the matching slice of its *input* features
#   and computes a *partial sum* of the output.
#
# Two operators glue the ranks together. ***g*** after `fc2` all-reduces the partial
# outputs in forward (identity in backward). ***f*** in front of `fc1` is the identity in
# forward and all-reduces the input gradient in backward — every rank's slice contributes
# to the gradient of the shared input.
#
# On both ranks, with the same seed, build a block of width 8 and hidden size 32, split it
# with `ColumnParallelLinear` / `RowParallelLinear`, and trace its collectives:

# %%
%%wb
import torch.nn.functional as F
from torch import nn

from workbench.parallel import ColumnParallelLinear, RowParallelLinear
from workbench.trace import CommTracer, Recorder

torch.manual_seed(0)  # the same full block and input on every rank
fc1, fc2 = nn.Linear(8, 32), nn.Linear(32, 8)
x = torch.randn(2, 3, 8)

col = ColumnParallelLinear.from_linear(fc1, dist.group.WORLD)
row = RowParallelLinear.from_linear(fc2, dist.group.WORLD)
print(f"fc1 {tuple(fc1.weight.shape)} -> this rank's slice {tuple(col.weight.shape)}")
print(f"fc2 {tuple(fc2.weight.shape)} -> this rank's slice {tuple(row.weight.shape)}")

recorder = Recorder(rank)
x_split = x.clone().requires_grad_()
with CommTracer(recorder):
    with recorder.phase_span("forward"):
        y = row(F.gelu(col(x_split)))
    with recorder.phase_span("backward"):
        y.sum().backward()
for e in recorder.events:
    if e.kind == "comm":
        print(f"  {e.phase:<8} {e.op} of {e.bytes} B")

x_full = x.clone().requires_grad_()
y_full = fc2(F.gelu(fc1(x_full)))
y_full.sum().backward()
print("output equals the unsplit block:        ", torch.allclose(y, y_full, atol=1e-6))
print("input gradient equals the unsplit block:", torch.allclose(x_split.grad, x_full.grad, atol=1e-6))

# %% [markdown]
# Exactly two collectives per block: *g* in forward and *f* in backward, each the size of
# the block's input/output — 2 × 3 × 8 floats = 192 bytes — not of its weights. Each rank
# holds half of each weight matrix (fc2's bias stays whole and is added once, after the
# sum), and the result is the unsplit block's, output and gradient alike.
#
# ## 2. The whole GPT with the hand-written split (`megatron`)
#
# Strategy `megatron` applies that split to every feed-forward block of the tiny GPT
# (2 layers) and leaves attention replicated. Both ranks process the *same* global batch
# of 8 — tensor parallelism splits the model, not the data.

# %%
import collections

import workbench

stepper = workbench.Stepper(model="gpt-tiny", strategy="megatron", batch_size=8)
stepper.step(2)


def collectives(events, step=1):
    """Rank 0's collectives in one step, counted by (phase, op, bytes, source)."""
    counts = collections.Counter(
        (e.phase, e.op, e.bytes, e.source)
        for e in events
        if e.kind == "comm" and e.rank == 0 and e.step == step
    )
    for (phase, op, nbytes, source), n in sorted(counts.items()):
        print(f"  {phase:<9} {n} x {op} of {nbytes:,} B ({source})")


collectives(stepper.events)

# %% [markdown]
# Per layer, one *g* in forward and one *f* in backward: 2 layers give 2 + 2 all-reduces,
# each of one layer's activations, batch × sequence × hidden × 4 bytes = 8 × 16 × 32 × 4 =
# 16,384 bytes. Unlike data parallelism's gradient all-reduce, these sit *between* layers:
# the next layer cannot start until they finish, so they cannot hide behind compute. That
# is why tensor parallelism is kept inside a node, on the fastest links (NVLink).
#
# ## 3. The same with DTensor (`tp`)
#
# PyTorch's DTensor expresses the split as data: a plan mapping module paths to
# `ColwiseParallel` or `RowwiseParallel`. The workbench's GPT plan splits attention too —
# `wq`, `wk`, `wv` column-wise (each rank gets whole heads), `wo` row-wise — and the MLP as
# above. One more entry, `PrepareModuleInput` on the attention block, turns its input into a
# single replicated DTensor that Q, K and V share:

# %%
from workbench.parallel import GPT_TP_PLAN

for path, style in GPT_TP_PLAN.items():
    print(f"{path:<18} {type(style).__name__}")

# %%
stepper.rebuild(strategy="tp")
stepper.step(2)
collectives(stepper.events)

# %% [markdown]
# Forward: 4 all-reduces = 2 layers × 2 row-parallel outputs (`wo` and `fc2`), Megatron's
# two *g*'s per layer. Backward: 4 as well — one *f* in front of attention and one in front
# of the MLP. Without the `PrepareModuleInput` entry DTensor would make the input of *each*
# column-parallel linear a distributed tensor of its own and all-reduce `wq`'s, `wk`'s and
# `wv`'s input gradients separately: 3 instead of 1. Sharing one DTensor lets the three
# partial gradients add up first, exactly as Megatron's fused QKV matrix does. That is the
# planner's cost model too: 4 all-reduces per layer and step. (The timeline shows where
# they sit: hover a bar for its bytes.)

# %% tags=["nbval-ignore-output"]
stepper.figures()["comm"]

# %% [markdown]
# ## 4. What each rank holds
#
# Splitting matrices divides their bytes; everything the plan leaves whole — embeddings,
# LayerNorms, the row-parallel biases and, under `megatron`, all of attention — stays on
# every rank. We can predict each rank's parameter bytes from the model alone: count the
# parameters the plan splits (halved on two ranks) and those it does not.

# %%
from fnmatch import fnmatch

from workbench.parallel import build_model, get_config
from workbench.parallel.tp import MLP_TP_PLAN

model = build_model(get_config("gpt-tiny"))


def predicted_param_bytes(plan, tp=2):
    split = whole = 0
    for name, p in model.named_parameters():
        module, _, kind = name.rpartition(".")
        style = next((s for pat, s in plan.items() if fnmatch(module, pat)), None)
        # Column-parallel splits weight and bias; row-parallel splits the weight only.
        if style is not None and (kind == "weight" or type(style).__name__ == "ColwiseParallel"):
            split += p.numel()
        else:
            whole += p.numel()
    return 4 * (whole + split // tp)


def measured_param_bytes(strategy):
    stepper.rebuild(strategy=strategy)
    stepper.step(1)
    return [max(e.params for e in stepper.events if e.kind == "memory" and e.rank == r)
            for r in (0, 1)]


single = 4 * sum(p.numel() for p in model.parameters())
print(f"{'single device':<14} {single:>8,} B")
# megatron splits the feed-forward blocks only: the MLP plan (layers.*.mlp.fc1 / fc2).
for strategy, tp_plan in (("megatron", MLP_TP_PLAN), ("tp", GPT_TP_PLAN)):
    measured = measured_param_bytes(strategy)
    predicted = predicted_param_bytes(tp_plan)
    print(
        f"{strategy:<14} {measured[0]:>8,} B on rank 0, {measured[1]:>8,} B on rank 1; "
        f"predicted {predicted:,} B: {measured == [predicted, predicted]} "
        f"({measured[0] / single:.0%} of one device)"
    )

# %% [markdown]
# The measured bytes match the count to the byte. Two ranks do not halve the model: in
# this tiny GPT the embeddings and norms are a large share, so DTensor TP keeps 55% per
# rank and the MLP-only split 70%. In a large model the split matrices dominate (96% of
# Llama 2 7B's parameters), and a vocabulary-parallel embedding (which Megatron adds)
# splits most of the rest. Gradients and Adam state follow the parameters, so they shrink
# by the same factor.
#
# Activations shrink less: every rank sees the whole batch, and the layer inputs, norms
# and residual stream are replicated.

# %%
for strategy in ("single", "megatron", "tp"):
    stepper.rebuild(strategy=strategy)
    stepper.step(1)
    act = max(e.activations for e in stepper.events if e.kind == "memory" and e.rank == 0)
    print(f"{strategy:<9} activations on rank 0: {act:>8,} B")

# %% [markdown]
# ## 5. Still the same training
#
# Splitting the matrices must not change the numbers. Both TP flavours against the
# single-device reference:

# %%
for strategy in ("megatron", "tp"):
    stepper.rebuild(strategy=strategy)
    stepper.run(4)
    losses = [e.value for e in stepper.events if e.kind == "metric" and e.rank == 0]
    reference = stepper.reference_losses()
    gap = max(abs(a - b) for a, b in zip(losses, reference, strict=True))
    print(f"{strategy:<9} 4 steps, largest loss difference vs one device below 1e-5: {gap < 1e-5}")

# %% [markdown]
# **What we saw.** Tensor parallelism splits each weight matrix across ranks and pays for
# it with all-reduces of *activations* inside every layer — one in forward and one in
# backward per Megatron block (more when Q, K and V are separate linears). Those
# all-reduces block the next layer, which is why TP lives inside a node. Each rank holds
# the split matrices' share plus everything left whole. Notebook 04 takes the other road:
# shard the *model state* of data parallelism (ZeRO / FSDP), and cut the model into
# pipeline stages.

# %%
stepper.close()
%wb stop
