# %% [markdown]
# # 11 · Five dimensions: every pipeline schedule, context parallel, expert parallel
#
# The Ultra-Scale Playbook teaches five dimensions of parallelism: data (dp), tensor (tp),
# pipeline (pp), context (cp) and expert (ep). Notebooks 02–04 ran the first three. Here
# the rest of the pipeline family — every schedule `torch.distributed.pipelining` ships —
# then context parallel and expert parallel, each on two CPU engines and each equal to one
# device. The pipeline bubbles are **measured** from the trace, next to the formula.

# %%
%load_ext workbench

# %%
%wb start -n 2

# %% [markdown]
# ## 1. Pipeline schedules side by side
#
# `gpt-small` has 4 blocks: two ranks with one stage each (GPipe, 1F1B), or two stages each
# (`stages_per_rank=2`: interleaved 1F1B and interleaved zero bubble loop them as
# rank, rank+2; ZB-V and DualPipeV place them in a V, so rank 0 holds the first and the
# last stage). Four micro-batches, three steps each; the loss must equal one device's.

# %%
import workbench

SCHEDULES = ("gpipe", "1f1b", "interleaved_1f1b", "zero_bubble", "zbv", "dualpipe_v")
stepper = workbench.Stepper(
    model="gpt-small", strategy="pp", microbatches=4, optimizer="sgd", reference=True
)
reference = None
bubbles = {}
for schedule in SCHEDULES:
    stepper.rebuild(schedule=schedule)
    stepper.step(3)
    if reference is None:
        reference = stepper.reference_losses()[:3]
    bubbles[schedule] = stepper.bubble()
    print(f"{schedule:<17} loss after 3 steps {stepper.status[0].loss:.4f}")
print(f"{'one device':<17} loss after 3 steps {reference[-1]:.4f}")

# %% [markdown]
# The formula for each (equal F, B and W costs; p = 2 ranks, m = 4 micro-batches, v
# stages per rank): GPipe and 1F1B (p−1)/(m+p−1); interleaved (p−1)/(v·m+p−1); interleaved
# zero bubble (p−1)/(3·v·m+p−1); ZB-V and DualPipeV schedule the weight gradients W into
# every gap, 0.

# %%
for schedule, rows in bubbles.items():
    print(f"{schedule:<17} analytic bubble {rows[0]['analytic']:.3f}")

# %% [markdown]
# And what each rank measured: its idle time inside the schedule, 1 − (time in its F, B,
# W actions) / (the schedule's span), steps 2–3. On a laptop CPU the actions are tiny and
# the send/recv overheads are not, so the measured bubbles sit above the formula, and
# they vary from run to run (nbval does not compare this cell's output).

# %% tags=["nbval-ignore-output"]
for schedule, rows in bubbles.items():
    print(f"{schedule:<17}", "  ".join(f"rank {r['rank']}: {r['measured']:.2f}" for r in rows))

# %% [markdown]
# The timeline draws every action per rank: `forward[mb=i]`, and for the zero-bubble
# schedules the split backward, `backward_input[mb=i]` (B) and `backward_weight[mb=i]`
# (W), with the stage when a rank holds two.

# %%
actions = sorted(
    {e.phase for e in stepper.events if e.kind == "phase" and e.rank == 0 and "[mb=" in e.phase}
)
print(len(actions), "distinct actions on rank 0 under dualpipe_v, e.g.")
print(*actions[:4], sep="\n")

# %% [markdown]
# Stepping a pipeline phase by phase runs one action on every rank: each rank's next
# phase is its own next action. Under 1F1B stage 0 warms up with two forwards while
# stage 1, the last, turns its first micro-batch around at once; a memory sample follows
# every action, and the gradients appear at each rank's first backward.

# %%
stepper.rebuild(schedule="1f1b")
stepper.phase()  # data
for _ in range(4):
    print("   ".join(f"rank {s.rank}: {s.next_phase:<15}" for s in stepper.status))
    stepper.phase()
for rank in (0, 1):
    samples = [e for e in stepper.events if e.kind == "memory" and e.rank == rank]
    first = next(e for e in samples if e.grads and e.label != "peak")
    print(f"rank {rank}: first gradients after {first.label} ({first.grads:,} B)")
_ = stepper.step()  # the schedule runs to its end

# %% [markdown]
# ## 2. Context parallel: the sequence split, attention around a ring
#
# `strategy="cp"`: rank r holds tokens [8r, 8r+8) of every 16-token sequence. Attention
# sends keys and values to the next rank and receives them from the previous one; their
# gradients go back the other way in backward.

# %%
stepper.rebuild(model="gpt-tiny", strategy="cp")
stepper.step(2)
print(f"cp loss after 2 steps {stepper.status[0].loss:.4f}, "
      f"one device {stepper.reference_losses()[1]:.4f}")
ops = sorted({(e.op, e.phase) for e in stepper.events if e.kind == "comm" and e.rank == 0})
print(ops)

# %%
def activations(strategy, rank):
    stepper.rebuild(strategy=strategy)
    stepper.step(1)
    return max(e.activations for e in stepper.events if e.kind == "memory" and e.rank == rank)


# rank 1 holds the later half of every sequence (the one that attends to all the keys);
# a single-device run records itself as rank 0
print(f"peak activations: cp rank 1 {activations('cp', 1):,} B, single device "
      f"{activations('single', 0):,} B")

# %% [markdown]
# ## 3. Expert parallel: tokens travel to their experts
#
# `moe-tiny` is gpt-tiny with 4 experts per block, each token routed to its top 2. With
# `strategy="ep"` each rank keeps 2 experts; tokens go to their experts' ranks in an
# all-to-all (dispatch) and come back in another (combine). The dispatch is labelled with
# the bytes this rank sent each expert:

# %%
stepper.rebuild(model="moe-tiny", strategy="ep")
stepper.step(2)
print(f"ep loss after 2 steps {stepper.status[0].loss:.4f}, "
      f"one device {stepper.reference_losses()[1]:.4f}")
for e in stepper.events:
    if e.kind == "comm" and e.rank == 0 and e.step == 0 and e.source.startswith("ep-dispatch"):
        print(e.source, f"({e.bytes:,} B in all)")

# %%
stepper.rebuild(strategy="dp")
stepper.step(2)
print(f"dp on moe-tiny, loss after 2 steps {stepper.status[0].loss:.4f}")

# %%
%wb stop
