# %% [markdown]
# # 01 · Why distributed: the memory arithmetic
#
# The first wall a large model hits is not speed but memory. Before a single token is
# processed, a training run must hold, for every parameter:
#
# - the **weights** themselves,
# - one **gradient** per weight (written by backward, read by the optimizer),
# - the **optimizer state** — Adam keeps two running moments, *m* and *v*, per weight.
#
# On top of that come the **activations**: every intermediate result of the forward pass
# that backward will need, which grows with batch size and sequence length.
#
# This notebook does that arithmetic by hand, lets the planner apply it to a 10-billion-
# parameter model on today's cards, and then measures a small model on real processes to
# check that the arithmetic is not a story but an exact count.

# %%
%load_ext workbench

# %% [markdown]
# ## Sixteen bytes per parameter
#
# In plain fp32 every number is 4 bytes: weight 4, gradient 4, Adam's *m* 4 and *v* 4.
# Mixed precision (bf16 compute) does not save as much as one might hope: weights and
# gradients shrink to 2 bytes, but the optimizer keeps an fp32 **master copy** of the
# weights (4) next to *m* and *v* (8). The planner encodes both tables:

# %%
from workbench.planner import TrainingSpec, state_bytes_per_param

N = 10_000_000_000  # a 10B model
for precision in ("fp32", "bf16-mixed"):
    b = state_bytes_per_param(TrainingSpec(precision=precision, optimizer="adamw"))
    print(
        f"{precision:<11} weights {b.weights} + grads {b.grads} + optimizer {b.optimizer:>2} "
        f"= {b.total} bytes/param -> {N * b.total / 1e9:,.0f} GB of model state"
    )

# %% [markdown]
# 160 GB of model state for 10B parameters, in either precision — against 24 GB on an
# RTX 4090 and 40 or 80 GB on an A100 or H100. The model does not fit on any single card
# before we have even counted activations.
#
# ## The planner's verdict, card by card
#
# `workbench.planner.plan` adds activations (Korthikanti et al.'s per-layer formula, for a
# shape the planner assumes from the parameter count) and the memory the CUDA runtime
# reserves, then compares the total with what the card can actually use:

# %%
from workbench.planner import plan

cards = ["rtx4090", "a100-40gb", "a100-80gb", "h100-80gb"]
single = {}
for card in cards:
    p = plan(params=10e9, hardware=card, gpus=1, precision="bf16-mixed", micro_batch=1)
    single[card] = p
    m = p.memory
    print(
        f"{card:<10} state {m.model_state / 1e9:5.0f} GB + activations "
        f"{m.activations / 1e9:4.1f} GB -> {p.verdict}"
    )
print()
print(single["h100-80gb"].notes[0])

# %% [markdown]
# Every card runs out of memory, by a factor of two to eight. This is the seed article's
# first pain point — *显存溢出* ("GPU memory overflow", OOM): "training cannot even start".
# (The seed's Chinese terms are quoted with an English gloss beside each; they show as
# boxes without a CJK font: on Debian or Ubuntu `apt-get install fonts-noto-cjk`.)
#
# The same numbers as stacked bars (the dashed line is each card's usable memory):

# %% tags=["nbval-ignore-output"]
from workbench.plots.planner import memory_breakdown_figure

memory_breakdown_figure(list(single.values()), labels=cards, title="10B, one GPU")

# %% [markdown]
# ## Activations grow with the batch
#
# Model state depends only on the parameter count. Activations depend on how much data
# flows through: per transformer layer Korthikanti et al. count `s·b·h·(34 + 5·a·s/h)`
# bytes in 16-bit training (s sequence, b micro-batch, h hidden size, a heads). Doubling
# the micro-batch doubles them; recomputing each layer in backward ("full" recompute)
# keeps only the layer input, `2·s·b·h`:

# %%
for recompute in ("none", "full"):
    row = []
    for mb in (1, 4, 16):
        p = plan(
            params=10e9, hardware="a100-80gb", gpus=1, precision="bf16-mixed",
            micro_batch=mb, recompute=recompute,
        )
        row.append(f"mb={mb:<2} {p.memory.activations / 1e9:6.1f} GB")
    print(f"recompute={recompute:<5}", " | ".join(row))

# %% [markdown]
# So even a model whose state fits can be pushed out of memory by its activations —
# the seed's third migration warning (*显存碎片与重计算*, "memory fragmentation and
# recomputation"): "even with parameters split,
# activations can still blow the memory; turn on gradient checkpointing".
#
# How many A100-80GB cards would the 10B model need at the least? The planner searches
# layouts (data, tensor and pipeline parallel, ZeRO stages, recompute) on 1, 2, 4, ... GPUs:

# %%
from workbench.planner import TrainingSpec, hardware_preset, min_gpus

ten_b = single["a100-80gb"].model
gpus, cheapest = min_gpus(ten_b, hardware_preset("a100-80gb"), TrainingSpec())
print(f"fits from {gpus} GPUs: {cheapest.layout()}")
print(cheapest.verdict)

# %% [markdown]
# Two cards are enough — but only by sharding the model state across them (ZeRO-3, which
# notebook 04 takes apart) and recomputing activations. Splitting the work across devices
# is what the rest of these notebooks are about.
#
# ## Measuring it: is the arithmetic exact?
#
# A prediction is only worth something if it matches a measurement. We start two engines
# (processes) and train the workbench's tiny GPT on each — strategy `single`: every engine
# holds the whole model, no communication. The workbench's memory tracer counts the bytes
# of every parameter, gradient and optimizer tensor exactly (by storage), and counts
# activations as the tensors autograd saves for backward.

# %%
%wb start -n 2

# %%
import workbench

stepper = workbench.Stepper(model="gpt-tiny", strategy="single", batch_size=8, optimizer="adamw")
stepper.step(2)
memory = [e for e in stepper.events if e.kind == "memory"]
print(f"{'phase':<10}{'params':>9}{'grads':>9}{'optimizer':>11}{'activations':>13}{'other':>7}")
for e in memory:
    if e.rank == 0 and e.step == 1:
        print(
            f"{e.phase:<10}{e.params:>9,}{e.grads:>9,}{e.optimizer:>11,}"
            f"{e.activations:>13,}{e.other:>7,}"
        )

# %% [markdown]
# Read the table row by row, one training step (step 1, the second):
#
# - **data**: parameters and the Adam state from step 0 are resident; no gradients.
# - **forward**: activations appear — everything backward will need.
# - **backward**: activations are consumed and freed; gradients appear, one per weight.
# - **sync**: nothing changes (one device has nothing to synchronise).
# - **optimizer**: Adam updates the weights from *m* and *v*; gradients are freed.
#
# (`other` is AdamW's `step` counter: one 4-byte scalar per parameter tensor, kept apart
# from the per-parameter state because it does not grow with the model's width.)
#
# Now the bytes per parameter:

# %%
from workbench.parallel import build_model, get_config

tiny = build_model(get_config("gpt-tiny"))
n_params = sum(p.numel() for p in tiny.parameters())
n_tensors = len(list(tiny.parameters()))
peak = {
    c: max(getattr(e, c) for e in memory if e.rank == 0 and e.step == 1)
    for c in ("params", "grads", "optimizer", "other")
}
print(f"{n_params:,} parameters in {n_tensors} tensors")
for category in ("params", "grads", "optimizer"):
    value = peak[category]
    print(f"{category:<10} {value:>9,} bytes = {value / n_params:.4f} bytes/param")
print(f"other      {peak['other']:>9,} bytes = 4 bytes x {n_tensors} tensors: "
      f"{peak['other'] == 4 * n_tensors}")

# %% [markdown]
# Exactly 4 + 4 + 8 = 16 bytes per parameter, as the arithmetic said.
#
# ## The planner against the measurement
#
# We describe the tiny GPT to the planner (its exact parameter count, its dimensions for
# the activation formula, fp32, AdamW, no dropout, a CPU "device") and let
# `planner.validate` hold the plan against the memory samples rank 0 recorded. Model state
# has zero tolerance — both sides count bytes — and activations 10%.

# %%
from workbench.planner import HardwareSpec, LinkSpec, ModelSpec, evaluate, validate
from workbench.planner.specs import ParallelSpec

config = get_config("gpt-tiny")
tiny_spec = ModelSpec(
    name="gpt-tiny", params=n_params, layers=config.n_layers, hidden=config.dim,
    heads=config.n_heads, vocab=config.vocab, seq=config.seq_len,
    tied_embeddings=True, learned_positions=True, bias=True,
)
loopback = LinkSpec(name="loopback", bandwidth=1e9, latency=1e-4)
cpu = HardwareSpec(
    name="this cpu", memory=8 * 2**30, peak_flops=1e10, intra=loopback, inter=loopback,
    kind="cpu",
)
training = TrainingSpec(micro_batch=8, precision="fp32", optimizer="adamw", dropout=False)
report = validate(memory, evaluate(tiny_spec, training, ParallelSpec(), cpu), rank=0, steps=[1])
print(report)
print("every row ok:", report.ok)

# %% [markdown]
# Weights, gradients and Adam's state match to the byte; activations (the planner's
# per-layer formula against the tensors autograd actually saved) to a fraction of a
# percent. The arithmetic of the first cells is what a real run allocates.
#
# The memory figure shows the same samples over time, on rank 0's panel alone: the
# `single` strategy trains one device, rank 0 of the running cluster (the next notebook
# draws one panel per rank):

# %% tags=["nbval-ignore-output"]
stepper.figures()["memory"]

# %% [markdown]
# **What we saw.** Model state is 16 bytes per parameter with Adam (4 with SGD's momentum
# on top of weights and gradients), whatever the precision; activations scale with batch
# and sequence. A 10B model needs ~160 GB before activations, far past any single card,
# and the byte counts the planner uses are the ones a real run allocates. The next
# notebook splits the *data* across ranks; notebook 04 splits the *model state*.

# %%
stepper.close()
%wb stop
