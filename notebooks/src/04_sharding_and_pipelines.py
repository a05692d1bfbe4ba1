# %% [markdown]
# # 04 · Sharding the model state, and cutting the model into a pipeline
#
# Data parallelism (notebook 02) keeps a full copy of the model state — weights,
# gradients, Adam's moments: 16 bytes per parameter — on every rank. With N ranks that is
# N identical copies. **ZeRO** (and PyTorch's FSDP, its implementation of stage 3) removes
# the redundancy step by step: stage 1 shards the optimizer state across the ranks, stage
# 2 also the gradients, stage 3 also the weights — paying with different collectives.
#
# **Pipeline parallelism** takes yet another cut: each rank holds a contiguous slice of the
# layers (a *stage*) and activations flow from stage to stage. Its cost is not bytes but
# idle time — the *bubble*.
#
# Both run here on two engines with the tiny GPT, measured byte for byte.

# %%
%load_ext workbench

# %%
%wb start -n 2

# %% [markdown]
# ## 1. Bytes per rank: dp, ZeRO-1, ZeRO-2, FSDP (ZeRO-3)
#
# The four strategies, each for two steps with AdamW; we keep each rank's largest sample
# per category in the second step (when Adam's state exists):
#
# - `dp` — DDP, everything replicated;
# - `zero1` — DDP plus PyTorch's `ZeroRedundancyOptimizer` (optimizer state sharded);
# - `zero2` — FSDP2 `fully_shard` without resharding after forward (gradients and optimizer
#   state sharded, weights gathered for the step);
# - `fsdp` — FSDP2 with resharding after forward: ZeRO-3, weights sharded too.

# %%
import workbench

stepper = workbench.Stepper(model="gpt-tiny", strategy="dp", batch_size=8)
CATEGORIES = ("params", "grads", "optimizer")


def peak(events, rank, step=1):
    samples = [e for e in events if e.kind == "memory" and e.rank == rank and e.step == step]
    return {c: max(getattr(e, c) for e in samples) for c in CATEGORIES}


measured, runs = {}, {}
for strategy in ("dp", "zero1", "zero2", "fsdp"):
    stepper.rebuild(strategy=strategy)
    stepper.step(3)
    runs[strategy] = stepper.events
    measured[strategy] = [peak(stepper.events, r) for r in (0, 1)]

print(f"{'':<7}" + "".join(f"{c + ' r0 / r1':>24}" for c in CATEGORIES))
for strategy, (r0, r1) in measured.items():
    print(f"{strategy:<7}" + "".join(f"{f'{r0[c]:,} / {r1[c]:,}':>24}" for c in CATEGORIES))

# %% [markdown]
# Read down the columns:
#
# - **params** stay whole (111,360 B) until `fsdp` halves them;
# - **grads** are halved from `zero2` on;
# - **optimizer** state is halved from `zero1` on.
#
# The planner predicts each column from the ZeRO rules alone:

# %%
from workbench.parallel import build_model, get_config
from workbench.planner import ModelSpec, ParallelSpec, TrainingSpec, model_state_bytes

config = get_config("gpt-tiny")
model = build_model(config)
N = sum(p.numel() for p in model.parameters())
spec = ModelSpec(
    name="gpt-tiny", params=N, layers=config.n_layers, hidden=config.dim,
    heads=config.n_heads, vocab=config.vocab, seq=config.seq_len,
)
training = TrainingSpec(precision="fp32", optimizer="adamw")
stage = {"dp": 0, "zero1": 1, "zero2": 2, "fsdp": 3}
for strategy, z in stage.items():
    predicted = model_state_bytes(spec, training, ParallelSpec(dp=2, zero=z))
    ok = all(tuple(m[c] for c in CATEGORIES) == predicted for m in measured[strategy])
    print(f"{strategy:<6} ZeRO-{z}: planner {predicted[0]:>7,} {predicted[1]:>7,} "
          f"{predicted[2]:>7,}   both ranks match to the byte: {ok}")

# %% [markdown]
# The ZeRO rules are the whole story: state divided by the number of ranks, category by
# category. (The two sharding implementations split differently — FSDP cuts every tensor
# in half, `ZeroRedundancyOptimizer` hands *whole* tensors to one rank or the other — but
# for this model both come out at exactly half.)
#
# ZeRO-3's weights are only sharded *at rest*. To compute a layer, FSDP all-gathers its
# full weights, uses them and frees them again. Sampled at the end of each phase (rank 0),
# the parameters of `zero2` stay gathered from forward through backward (no second
# gather) and are resharded once the gradients are reduced, while `fsdp` is back to its
# shard after every phase:

# %%
for strategy in ("zero2", "fsdp"):
    row = [
        f"{e.phase} {e.params:,}"
        for e in runs[strategy]
        if e.kind == "memory" and e.rank == 0 and e.step == 1 and e.label != "peak"
    ]
    print(f"{strategy:<6}", " | ".join(row))

# %% [markdown]
# ## 2. What the sharding costs in collectives
#
# Sharded state must be reassembled. Rank 0's collectives in step 2 (step 1 of DDP also
# carries a one-off bucket rebuild), with the bytes the tracer records — the full buffer:
# the gathered output of an all-gather, the input of a reduce-scatter:

# %%
import collections

for strategy, events in runs.items():
    counts = collections.Counter(
        (e.phase, e.op, e.source)
        for e in events
        if e.kind == "comm" and e.rank == 0 and e.step == 2 and e.bytes > 4
    )
    volume = collections.Counter()
    for e in events:
        if e.kind == "comm" and e.rank == 0 and e.step == 2 and e.bytes > 4:
            volume[e.op] += e.bytes
    print(f"{strategy}:")
    for (phase, op, source), n in sorted(counts.items()):
        print(f"    {phase:<9} {n:>2} x {op:<14} ({source})")
    print("    bytes by op:", {op: f"{b:,}" for op, b in sorted(volume.items())})

# %% [markdown]
# - `dp`: one all-reduce of the whole gradient (111,360 B), in the `sync` phase (the
#   stepper's default `overlap=False`; with DDP's overlap it moves into backward, notebook 02).
# - `zero1`: the same gradient all-reduce (by DDP's bucket hook, inside backward) —
#   `ZeroRedundancyOptimizer` shards only the optimizer —
#   and then, after each rank has updated *its* tensors, a broadcast of every tensor from
#   the rank that owns it, so all replicas have the new weights.
# - `zero2`: the weights are all-gathered in forward (one gather per FSDP unit: the two
#   blocks and the root with the embeddings) and the gradients reduce-scattered in
#   backward: each rank receives only the summed shard it will update.
# - `fsdp`: the same, plus a *second* all-gather of each block in backward, because the
#   full weights were freed after forward.
#
# In the ring cost model an all-reduce moves 2(n−1)/n of the buffer per rank, an
# all-gather or reduce-scatter (n−1)/n. So ZeRO-2 costs the same traffic as DDP (gather +
# reduce-scatter = all-reduce) and ZeRO-3 1.5× — bought with N-fold less model state.
# That is the trade notebook 01's 10B model needs: sharded over two A100s it fits.
#
# The FSDP timeline (gathers before each unit's compute, reduce-scatters during backward):

# %% tags=["nbval-ignore-output"]
stepper.figures()["comm"]

# %% [markdown]
# And all three still train exactly like one device:

# %%
for strategy in ("zero1", "zero2", "fsdp"):
    stepper.rebuild(strategy=strategy)
    stepper.run(4)
    losses = [e.value for e in stepper.events if e.kind == "metric" and e.rank == 0]
    gap = max(abs(a - b) for a, b in zip(losses, stepper.reference_losses(), strict=True))
    print(f"{strategy:<6} largest loss difference vs one device over 4 steps below 1e-5: {gap < 1e-5}")

# %% [markdown]
# ## 3. Pipelines: stages, micro-batches and the bubble
#
# Strategy `pp` cuts the GPT into two stages: rank 0 holds the embeddings and the first
# half of the layers, rank 1 the second half, the final norm and the head (plus its own
# copy of the tied embedding weight, whose gradient the two stages sum). Activations go
# rank 0 → rank 1 in forward and their gradients back in backward, point to point.
#
# A single batch would leave one stage idle while the other works. So the batch is cut
# into *m* micro-batches that follow each other through the pipe. Two classic schedules:
#
# - **GPipe**: all forwards, then all backwards;
# - **1F1B**: after a short warm-up, each stage alternates one forward and one backward.
#
# The stepper marks every micro-batch's forward and backward as a span `forward[mb=i]` /
# `backward[mb=i]`. Their order on each rank, for m = 4:

# %%
def order(events, rank, step=1):
    spans = [e for e in events
             if e.kind == "phase" and e.rank == rank and e.step == step and "[mb=" in e.phase]
    spans.sort(key=lambda e: e.start)
    return [("F" if e.phase.startswith("forward") else "B") + e.phase[-2] for e in spans]


def in_flight(sequence):
    """Most micro-batches whose forward has run and backward has not (activations held)."""
    held = most = 0
    for item in sequence:
        held += 1 if item[0] == "F" else -1
        most = max(most, held)
    return most


pipes = {}
for schedule in ("gpipe", "1f1b"):
    stepper.rebuild(strategy="pp", schedule=schedule, microbatches=4)
    stepper.step(3)
    pipes[schedule] = stepper.events
    for rank in (0, 1):
        seq = order(stepper.events, rank)
        print(f"{schedule:<6} rank {rank}: {' '.join(seq)}   in flight at most: {in_flight(seq)}")

# %% [markdown]
# GPipe runs all four forwards before the first backward, so every stage holds the
# activations of all *m* micro-batches at once. 1F1B starts backward as soon as the first
# micro-batch has left the last stage: rank 1 never holds more than one micro-batch, rank
# 0 at most two — at most *p* (the number of stages) instead of *m*. Same result, same
# bubble, far less activation memory, which is why 1F1B is the default in practice.
#
# Each rank holds only its stage's parameters, and the traffic between them is one
# micro-batch's activations (2 × 16 × 32 × 4 = 4,096 bytes) forward and its gradient
# back, per micro-batch (step 2 shown; the first step also exchanges a few bytes of shape
# information):

# %%
for rank in (0, 1):
    params = peak(pipes["1f1b"], rank)["params"]
    sends = collections.Counter(
        f"{e.op} {e.bytes:,} B"
        for e in pipes["1f1b"]
        if e.kind == "comm" and e.rank == rank and e.step == 2 and e.source == "pipeline"
    )
    print(f"rank {rank}: {params:,} B of parameters (one device: {4 * N:,} B); p2p: {dict(sends)}")

# %% [markdown]
# ### The bubble
#
# Stage 1 cannot start before stage 0 has finished the first micro-batch's forward; stage
# 0 has nothing to do at the end while the last backwards drain through stage 1. Counting
# in units of one micro-batch's work per stage, the pipeline spends (p − 1) units filling
# and draining around *m* units of useful work: the idle time is (p − 1)/m of the compute,
# i.e. a share (p − 1)/(m + p − 1) of the step. More micro-batches, smaller bubble:

# %%
p = 2
for m in (1, 2, 4, 8):
    print(f"m = {m}: bubble (p-1)/m = {(p - 1) / m:.3f} of compute, {(p - 1) / (m + p - 1):.3f} of the step")

# %% [markdown]
# We can measure it from the spans: over the window from the first micro-batch's start
# to the last one's end, the share of time each rank is *not* inside a micro-batch span.
# We use the larger `gpt-small` preset (4 layers, hidden 128, sequence 64) and a batch of
# 16 so each micro-batch does more work. On GPUs with large layers the measurement
# approaches the formula. On two shared CPU cores a micro-batch still takes only a few
# milliseconds, comparable to the Python scheduling and the gloo send/receive around it,
# so the measured idle share is larger and noisy — the numbers change from run to run
# (which is why this cell's output is not compared):

# %% tags=["nbval-ignore-output"]
def idle_share(events, step):
    spans = [e for e in events if e.kind == "phase" and e.step == step and "[mb=" in e.phase]
    t0, t1 = min(e.start for e in spans), max(e.end for e in spans)
    return [1 - sum(e.end - e.start for e in spans if e.rank == r) / (t1 - t0) for r in (0, 1)]


for m in (1, 2, 4, 8):
    stepper.rebuild(
        model="gpt-small", strategy="pp", schedule="gpipe", microbatches=m, batch_size=16
    )
    stepper.step(3)
    shares = [idle_share(stepper.events, s) for s in (1, 2)]
    measured_share = sum(sum(s) for s in shares) / 4
    print(f"m = {m}: measured idle share {measured_share:.2f}, formula {(p - 1) / (m + p - 1):.2f}")

# %% [markdown]
# The timeline of the last run (m = 8) shows the micro-batch spans inside each rank's
# `forward` phase, the fill at the start and the drain at the end:

# %% tags=["nbval-ignore-output"]
stepper.figures()["comm"]

# %% [markdown]
# **What we saw.** ZeRO removes data parallelism's redundant copies: stage by stage the
# optimizer state, the gradients and the weights are split across ranks, exactly as the
# planner counts them, at the price of all-gathers and reduce-scatters (1.5× DDP's traffic
# for ZeRO-3). Pipelines split the layers into stages and talk only at stage boundaries,
# at the price of the bubble, which more micro-batches shrink and 1F1B makes cheap in
# memory. Notebook 05 puts numbers on the communication: how fast the links are, and how
# the cost grows with the cluster.

# %%
stepper.close()
%wb stop
