# %% [markdown]
# # 07 · Choosing a setup: one GPU or many?
#
# The seed article closes with a comparison table — single-GPU training against
# multi-node distributed training, on memory, throughput, communication, deployment,
# fault recovery and cost — and two scenarios: prototyping and light fine-tuning (LoRA) on
# one machine, and pre-training a very large model across many nodes.
#
# Its table is qualitative ("easily OOM", "very high", "low"). Here we fill every row with
# numbers: measured on this machine's two engines (a small GPT, CPU processes standing in
# for GPUs), and predicted by the planner for real models on real clusters.

# %%
%load_ext workbench

# %%
%wb start -n 2

# %% [markdown]
# ## Measured here: one device against two ranks
#
# The `gpt-small` preset (0.8M parameters, sequence 64), a global batch of 16, AdamW.
# Three runs of five steps: on one device, with DDP over both ranks, and with FSDP
# (ZeRO-3) over both ranks.

# %%
import statistics

import workbench

cluster = workbench.Cluster.current()
stepper = workbench.Stepper(model="gpt-small", strategy="single", batch_size=16)
tokens = 16 * 64
runs = {}
for strategy in ("single", "dp", "fsdp"):
    stepper.rebuild(strategy=strategy)
    stepper.step(5)
    runs[strategy] = stepper.events


def per_step(events, strategy):
    ev = [e for e in events if e.rank == 0 and e.step >= 1]
    mem = [e for e in ev if e.kind == "memory"]
    steps = sorted({e.step for e in ev if e.kind == "phase"})
    seconds = statistics.median(
        sum(e.duration_s for e in ev if e.kind == "phase" and e.step == s and "[" not in e.phase)
        for s in steps
    )
    comm = sum(e.bytes for e in ev if e.kind == "comm" and e.step == 1)
    return {
        "state": max(e.params + e.grads + e.optimizer for e in mem),
        "comm": comm,
        "seconds": seconds,
    }


measured = {s: per_step(ev, s) for s, ev in runs.items()}
for strategy, m in measured.items():
    print(
        f"{strategy:<7} model state per rank {m['state']:>10,} B   "
        f"sent per step per rank {m['comm']:>10,} B   {tokens / m['seconds']:.0f} tokens/s"
    )

# %% [markdown]
# Deployment and recovery, measured too: how long the two engines took to start and join
# a process group, and what it takes to roll back after a failure — the run saves a
# checkpoint on every rank at step 3, runs on, and is loaded back to it (notebook 06 kills
# engines for real):

# %%
import tempfile
import time

print(f"cluster start-up (engines + process group): {cluster.timings['total_s']:.1f} s")
stepper.rebuild(strategy="dp")
stepper.run(3)
checkpoint_dir = tempfile.mkdtemp(prefix="wb-07-")
t0 = time.perf_counter()
stepper.save(checkpoint_dir)
save_s = time.perf_counter() - t0
stepper.run(2)
after = [round(s.loss, 6) for s in stepper.status]
t0 = time.perf_counter()
stepper.load(path=checkpoint_dir)
load_s = time.perf_counter() - t0
print(f"checkpoint save {save_s * 1e3:.0f} ms, load {load_s * 1e3:.0f} ms on every rank")
print("back at step:", [s.step for s in stepper.status])
stepper.run(2)
print("replayed steps give the same losses:", [round(s.loss, 6) for s in stepper.status] == after)

# %% [markdown]
# ## Predicted at scale: one GPU against a cluster
#
# The planner answers the same questions for Llama 2 7B pre-training on H100s (bf16,
# AdamW, sequence 4,096): one GPU, one node of 8, and 8 nodes of 8 (64 GPUs) over
# InfiniBand — the cheapest layout that fits on one GPU (if any) and the recommended
# layouts on 8 and 64.

# %%
from workbench.planner import (
    TrainingSpec, hardware_preset, model_preset, plan, recommend,
)

llama = model_preset("llama2-7b")
h100 = hardware_preset("h100-80gb")
training = TrainingSpec(micro_batch=1, seq=4096)
one = plan(llama, h100, gpus=1, training=training, recompute="full")
node = recommend(llama, h100, 8, training).best
cluster_plan = recommend(llama, h100, 64, training).best
for name, p in (("1 GPU", one), ("8 GPUs", node), ("64 GPUs", cluster_plan)):
    t = p.time
    print(f"{name:<8} {p.layout():<48} {p.verdict}")
    if p.fits:
        print(f"{'':<8} {p.tokens_per_s:>9,.0f} tokens/s, exposed communication "
              f"{t.comm_exposed / t.total:.0%} of the step")
print(f"64 GPUs run {cluster_plan.tokens_per_s / node.tokens_per_s:.1f}x faster than one node")

# %% [markdown]
# Cost: the time and GPU-hours to pre-train on 1 trillion tokens (the planner's
# throughput, strong-scaled: the global batch fixed at 512 sequences as more GPUs share
# it):

# %%
from workbench.planner import scaling

budget = 1e12
fixed = training.with_(global_batch=512, recompute="selective")
for point in scaling(llama, h100, fixed, gpus=(8, 64, 512), zero=1):
    days = budget / point.tokens_per_s / 86400
    gpu_hours = budget / point.tokens_per_s / 3600 * point.gpus
    print(f"{point.gpus:>4} GPUs: {days:7.1f} days, {gpu_hours:>9,.0f} GPU-hours "
          f"(efficiency {point.efficiency:.0%})")

# %% [markdown]
# ## The table, filled in
#
# | | single GPU / single device | distributed (here: 2 ranks; planner: 64 GPUs) |
# |---|---|---|
# | **Memory** | every rank holds all 16 bytes/param (measured: `single` row above); a 7B model's state alone (108 GB) exceeds an 80 GB card, even with full recompute | FSDP halved the model state per rank on 2 ranks, exactly as the planner counts; sharded over 8 or 64 GPUs the 7B model fits with room to spare |
# | **Throughput** | one device's rate (measured tokens/s above) | up to N× — measured above for 2 ranks on two shared CPU cores; the planner gives 64 GPUs 7.3× one 8-GPU node, not 8× (notebook 05) |
# | **Communication** | none: 0 bytes sent per step | DDP all-reduces the full gradient every step (measured: 4 bytes/param); FSDP hands 3× those bytes to its collectives, 1.5× the link traffic; the exposed share grows across nodes |
# | **Deployment** | one process | a process group: engines, ranks, rendezvous (measured start-up above), the same code everywhere (notebook 08) |
# | **Recovery** | restart the process | every rank saves a checkpoint; on failure all ranks roll back together and redo the steps since (measured above; notebook 06) |
# | **Cost** | fixed, small — but the 7B pre-training would take years on one card | elastic: 512 GPUs finish in days, but pay more GPU-hours per token than 8 (efficiency < 100%) |
#
# ## The seed's two scenarios, as planner recommendations
#
# **Scenario 1 — prototype and light fine-tuning (LoRA) on one machine.** LoRA trains
# small adapter matrices (here 1% of the parameters) next to frozen weights, so gradients
# and optimizer state shrink a hundredfold and only the frozen bf16 weights remain. The
# planner's recommendation for Llama 2 7B on a single 24 GB RTX 4090:

# %%
lora = TrainingSpec(micro_batch=1, seq=2048, trainable=0.01)
print(recommend(llama, hardware_preset("rtx4090"), 1, lora))

# %% [markdown]
# It fits one consumer card (with activation recompute). Full fine-tuning of the same
# model does not fit even an 80 GB A100 — the planner says how many it would take:

# %%
print(recommend(llama, hardware_preset("a100-80gb"), 1, TrainingSpec(micro_batch=1, seq=2048)))

# %% [markdown]
# So for prototyping and LoRA the seed's advice holds, now with numbers: one box, no
# distributed machinery.
#
# **Scenario 2 — pre-training a large model across nodes.** Llama 2 70B on 8 nodes of
# 8 H100s:

# %%
print(recommend(model_preset("llama2-70b"), h100, 64, TrainingSpec(micro_batch=1, seq=4096)))

# %% [markdown]
# Pure data parallelism would fit, but runs 49% slower: the planner combines
# tensor parallelism *inside* each node (TP=4 over NVLink, where its per-layer
# all-reduces belong — notebook 03) with a two-stage pipeline and data parallelism
# *across* nodes (its optimizer state sharded, ZeRO-1), and recomputes part of the
# activations — the seed's "tensor parallelism combined with other parallelism
# across a high-performance cluster", derived rather than asserted.
#
# **What we saw.** Every qualitative cell of the seed's table has a number behind it: the
# memory split is exact, the communication volume is set by the model size, throughput
# grows with devices at a falling efficiency, and recovery means checkpoints. Start on
# one device while the model and the data allow it; go distributed when the planner says
# the model does not fit, or when the time-to-result matters more than the GPU-hours.

# %%
import shutil

shutil.rmtree(checkpoint_dir)
stepper.close()
%wb stop
