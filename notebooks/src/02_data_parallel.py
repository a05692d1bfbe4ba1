# %% [markdown]
# # 02 · Data parallel: same model, different data, one gradient
#
# Data parallelism is the first thing the seed article's migration list asks for: "change
# the DataLoader so that every node gets *different* data, and wrap the model in a
# parallel wrapper". Every rank holds a full copy of the model, takes its own slice of the
# global batch, computes gradients on it, and then the ranks **all-reduce** their
# gradients so that every copy takes the same optimizer step.
#
# This notebook follows that recipe on two engines: first the data split, then one DDP
# step phase by phase, then the all-reduce in time (after backward, or overlapped with it),
# and finally the proof that two ranks train exactly like one device.

# %%
%load_ext workbench

# %%
%wb start -n 2

# %% [markdown]
# ## 1. Sharding the data: `DistributedSampler`
#
# The seed's pseudo-code creates `DistributedSampler(dataset, shuffle=True)`. Inside a
# process group the sampler reads its rank and the world size from the group. Each epoch
# it draws one permutation of all indices (seeded by `seed + epoch`, so every rank draws
# the *same* one) and deals it out round-robin. Run it on both ranks, for a 16-sample
# data set:

# %%
%%wb
from torch.utils.data import DistributedSampler

sampler = DistributedSampler(range(16), shuffle=True, seed=0)
for epoch in (0, 1):
    sampler.set_epoch(epoch)
    print(f"epoch {epoch}: {list(sampler)}")

# %% [markdown]
# `workbench.parallel.rank_indices` computes the same thing without a process group, so
# we can check the three properties data parallelism relies on:

# %%
from workbench.parallel import rank_indices

epoch0 = rank_indices(16, 2, epoch=0)
epoch1 = rank_indices(16, 2, epoch=1)
print("rank 0, epoch 0:", epoch0[0])
print("rank 1, epoch 0:", epoch0[1])
print("disjoint (no sample on both ranks):", not set(epoch0[0]) & set(epoch0[1]))
print("complete (together, every sample): ", sorted(epoch0[0] + epoch0[1]) == list(range(16)))
print("reshuffled in epoch 1:             ", epoch1[0] != epoch0[0])

# %% [markdown]
# One more property makes a data-parallel run *comparable* with a single device. With a
# global batch of 8, each rank takes 4 samples per step. Because the permutation is dealt
# round-robin, the two ranks' batches at step *i* together are exactly the 8 samples a
# single device takes at step *i*:

# %%
single = rank_indices(16, 1, epoch=0)[0]  # one "rank" sees the whole permutation
for step in (0, 1):
    ranks = [epoch0[r][4 * step : 4 * step + 4] for r in (0, 1)]
    same = sorted(ranks[0] + ranks[1]) == sorted(single[8 * step : 8 * step + 8])
    print(f"step {step}: rank 0 {ranks[0]}  rank 1 {ranks[1]}  = single-device batch: {same}")

# %% [markdown]
# ## 2. One DDP step, phase by phase
#
# A `Stepper` builds the same run on every rank — here the tiny GPT under DDP with a
# global batch of 8 — and advances all ranks together, one phase at a time:
# **data → forward → backward → sync → optimizer**. We start with `overlap=False`: backward
# only computes local gradients and the all-reduce waits for the `sync` phase, so each
# phase does one thing and we can watch it.
#
# After every phase we print, per rank, what ran, the gradient and activation bytes at its
# end, any collective it issued, and the phase each rank will run next (`status`).

# %%
import workbench

stepper = workbench.Stepper(model="gpt-tiny", strategy="dp", batch_size=8, overlap=False)


def show(new_events):
    for status in stepper.status:
        mine = [e for e in new_events if e.rank == status.rank]
        ran = [e.phase for e in mine if e.kind == "phase"][-1]
        mem = [e for e in mine if e.kind == "memory"][-1]
        print(
            f"[rank {status.rank}] ran {ran:<9} grads {mem.grads:>7,} B  "
            f"activations {mem.activations:>7,} B  -> next: {status.next_phase}"
        )
        for e in mine:
            if e.kind == "comm":
                print(f"           {e.op} of {e.bytes:,} B over {e.group_size} ranks ({e.source})")


show(stepper.phase())

# %% [markdown]
# **data**: each rank loaded its 4 samples. Nothing else happened yet.

# %%
show(stepper.phase())

# %% [markdown]
# **forward**: each rank ran the whole model on its own 4 samples; the activations it
# keeps for backward are identical in size on both ranks (same model, same batch shape),
# though their values differ (different samples).

# %%
show(stepper.phase())

# %% [markdown]
# **backward**: the activations are consumed and each rank now holds a full set of
# gradients — 111,360 bytes, 4 per parameter — computed from *its* samples only. The two
# ranks' gradients differ. No communication yet.

# %%
show(stepper.phase())

# %% [markdown]
# **sync**: the all-reduce. Its size is the whole gradient, 111,360 bytes: every rank
# sends and receives on the order of the full model's gradients every step, whatever the
# batch size — which is why data parallelism's cost is set by the *model* size and the
# link bandwidth. The gradients are summed and divided by the world size, so both ranks
# now hold the gradient of the mean loss over all 8 samples. (The 4-byte all-reduce
# averages the loss, for reporting only.)

# %%
show(stepper.phase())
print("losses:", [round(s.loss, 6) for s in stepper.status])

# %% [markdown]
# **optimizer**: both ranks apply the same gradient to the same weights, so the copies
# stay identical; gradients are freed. The loss, averaged over the two halves, is the
# same on both ranks.
#
# ## 3. The all-reduce in time
#
# The stepper records every phase and collective with its start and end on a common
# clock. The timeline shows, per rank, a compute lane (the phases) and a communication
# lane (the collectives). Run two more steps and look (hover for bytes and bandwidth):

# %%
_ = stepper.step(2)  # returns the new events; we look at them in the figure

# %% tags=["nbval-ignore-output"]
stepper.figures()["comm"]

# %% [markdown]
# With `overlap=False` the gradient all-reduce sits in its own `sync` phase, after
# backward has finished, on both ranks. Let us check that from the events rather than by
# eye — for every step and rank, does the gradient all-reduce start after backward ends?


# %%
def placement(events, source):
    """(step, rank) -> where each gradient all-reduce falls relative to backward."""
    spans = {(e.step, e.rank, e.phase): e for e in events if e.kind == "phase"}
    out = []
    for e in events:
        # The gradient all-reduce (not the 4-byte loss average) issued by `source`.
        if e.kind == "comm" and e.source == source and e.bytes > 4:
            back = spans[(e.step, e.rank, "backward")]
            where = (
                "inside backward" if back.start <= e.start <= back.end
                else "after backward" if e.start >= back.end else "before backward"
            )
            out.append((e.step, e.rank, e.phase, where))
    return sorted(out)


for row in placement(stepper.events, "workbench"):
    print("step {} rank {}: phase {}, {}".format(*row))

# %% [markdown]
# Waiting for the whole backward before communicating wastes time: the gradients of the
# last layers are ready long before backward reaches the first layer. This is what real
# DDP does instead (`overlap=True`, "DDP as shipped"): it groups gradients into
# **buckets** and starts each bucket's all-reduce *during* backward, as soon as the bucket
# is full, so communication hides behind the rest of the backward computation.
#
# `rebuild` changes one option and rebuilds the run on every rank from the same seed:

# %%
stepper.rebuild(overlap=True)
stepper.step(3)
for row in placement(stepper.events, "ddp-bucket"):
    print("step {} rank {}: phase {}, {}".format(*row))
comm = [e for e in stepper.events if e.kind == "comm" and e.step == 2 and e.rank == 0]
print()
print("step 2, rank 0 collectives:", [(e.op, e.bytes, e.source, e.phase) for e in comm])

# %% [markdown]
# Now the gradient all-reduce is issued from inside backward, by DDP's bucket hook (the
# tiny model's 111,360 bytes fit in one 25 MB bucket; a large model has many, launched
# one after another while backward continues). The `sync` phase only carries the 4-byte
# loss average. (In step 1 DDP also broadcasts a few bytes once: after the first
# iteration it rebuilds its buckets in the order gradients actually arrived.)

# %% tags=["nbval-ignore-output"]
stepper.figures()["comm"]

# %% [markdown]
# ## 4. Two ranks train exactly like one device
#
# The whole point of the exercise: data parallelism must not change *what* is learned.
# The stepper can compute the single-device run on the same global batches (on rank 0's
# engine, no communication), and we compare the losses step by step:

# %%
stepper.reset()
stepper.run(6)
dp_losses = [e.value for e in stepper.events if e.kind == "metric" and e.rank == 0]
reference = stepper.reference_losses()
for step, (a, b) in enumerate(zip(dp_losses, reference, strict=True)):
    print(f"step {step}: 2 ranks {a:.5f}   one device {b:.5f}")
print("largest difference below 1e-5:", max(abs(a - b) for a, b in zip(dp_losses, reference)) < 1e-5)

# %% [markdown]
# The losses agree to floating-point rounding (the all-reduce sums in a different order
# than one device would). The loss falls because the synthetic data is learnable.
#
# The figure overlays both ranks' losses with the single-device reference:

# %% tags=["nbval-ignore-output"]
stepper.reference = True
stepper.figures()["loss"]

# %% [markdown]
# **What we saw.** `DistributedSampler` gives every rank a disjoint slice of each epoch,
# reshuffled per epoch, and the slices of one step add up to the single-device batch.
# Every step each rank all-reduces its full gradient (4 bytes per parameter here) — after
# backward, or overlapped with it in buckets, which is what makes DDP fast. The result is
# the single-device training run, computed by two processes. What data parallelism does
# *not* do is save memory: each rank still holds all 16 bytes per parameter. Notebook 03
# splits the layers themselves; notebook 04 shards the model state.

# %%
stepper.close()
%wb stop
