# %% [markdown]
# # 06 · Faults and checkpoints: when a rank dies, or never shows up
#
# The seed article's comparison has one row where a single machine clearly wins:
# **fault tolerance**. On one machine a crash is simple — restart the process. Across many
# nodes "any node that goes down can stall the global gradient update", so distributed
# training needs **periodic checkpoints** and an **elastic recovery** strategy: roll every
# rank back to the last checkpoint and carry on.
#
# Why does one dead node stall *everyone*? In data parallelism every step ends in an
# all-reduce of the gradients, and an all-reduce needs every rank. If one rank is gone,
# the others wait in the collective for a peer that will never come. The same happens
# without any crash when one rank simply never calls the collective (a bug, a skipped
# branch): the others hang.
#
# This notebook provokes both on two engines and watches the workbench handle them:
#
# 1. train three steps and save a checkpoint;
# 2. kill rank 1's engine in the middle of step 4 — the next call fails fast and names the
#    rank;
# 3. `%wb restart` replaces only the dead engine, rolls back to the checkpoint, and training
#    continues to exactly the losses of a run that was never interrupted;
# 4. a collective that one rank never joins: the timeout report says who waits where;
# 5. a run that loses a rank goes on with fewer (the same global batch), then grows back.

# %%
%load_ext workbench

# %%
%wb start -n 2

# %% [markdown]
# ## 1. Train, then checkpoint
#
# The stepper is the one from notebook 02: the tiny GPT under DDP, global batch 8. New is
# `checkpoint_dir=`: where the run's checkpoints go. We put it in a temporary directory
# that this notebook removes at the end.

# %%
import tempfile
from pathlib import Path

import workbench

workdir = tempfile.mkdtemp(prefix="wb-06-")
ckpt_root = str(Path(workdir, "ckpt"))

stepper = workbench.Stepper(
    model="gpt-tiny", strategy="dp", batch_size=8, checkpoint_dir=ckpt_root
)
stepper.run(3)
print("steps done:", stepper.session.step_index)
print("losses:", [round(s.loss, 5) for s in stepper.status])

# %% [markdown]
# `%wb checkpoint save` checkpoints the current stepper's run on every rank at a step
# boundary. It prints the directory it wrote; that path contains the random name of our
# temporary directory, so this cell captures the output and shows the root as
# `<ckpt_root>` (the notebook is also a regression test, and its output must be the same
# on every run).

# %%
from IPython.utils.capture import capture_output

with capture_output() as saved:
    %wb checkpoint save
print(saved.stdout.replace(ckpt_root, "<ckpt_root>"), end="")

# %% [markdown]
# A checkpoint is a directory per step. Inside it, each rank wrote the tensors it owns
# with `torch.distributed.checkpoint` (under DDP the weights are replicated, so rank 0
# writes them once), plus every rank's random-number state and a `meta.json` with the
# step, the data position and the last loss. Saving is atomic: the ranks write into a
# temporary directory that is renamed into place only when all of them have finished, so a
# crash *during* a save leaves the previous checkpoint intact.

# %%
%wb checkpoint list

# %%
print(sorted(p.name for p in Path(ckpt_root, "step-00000003").iterdir()))

# %% [markdown]
# The random-number states matter for the claim we want to make at the end: a resumed run
# must draw the *same* batches and dropout masks as an uninterrupted one, or its losses
# would differ.
#
# ## 2. A rank dies in the middle of step 4
#
# Step 4 starts: every rank loads its batch (the `data` phase). Then we kill rank 1's
# engine process with `SIGKILL` — the closest thing to a node losing power: no clean-up,
# no goodbye message. The process id comes from the cluster's rank table; we do not print
# it (it changes from run to run).

# %%
import os
import signal
import time

cluster = workbench.Cluster.current()
stepper.phase()  # step 4, phase "data", on both ranks
print("next phase on each rank:", [s.next_phase for s in stepper.status])

victim = cluster.ranks[1]
old_engine = {r.rank: r.engine_id for r in cluster.ranks}
old_pid = {r.rank: r.pid for r in cluster.ranks}
os.kill(victim.pid, signal.SIGKILL)

# %% [markdown]
# Now ask the stepper to finish step 4. Rank 0 would run forward and backward and then
# wait in the gradient all-reduce for rank 1 — forever, or until the process group's
# timeout. The workbench does not wait for that: it notices that rank 1's engine is gone
# and raises `EngineDied` at once, naming the rank.

# %%
started = time.monotonic()
try:
    stepper.step()
except workbench.EngineDied as exc:
    died = exc
elapsed = time.monotonic() - started

print("error:", type(died).__name__)
print("dead ranks:", died.ranks)
print("failed fast (well before the 300 s step timeout):", elapsed < 30)
for s in stepper.status:
    print(f"rank {s.rank} was in step {s.step + 1}, next phase {s.next_phase!r}")
print("cluster state:", cluster.state)

# %% [markdown]
# The error's full message also names the engine and its host, and ends with what to do.
# Its last line (no host names in it) is the run's context:

# %%
print(str(died).splitlines()[-1])

# %% [markdown]
# `%wb status` agrees: rank 1's engine is `dead`. Rank 0 may still be `busy` for a moment,
# finishing its part of step 4 until its next collective finds the peer gone, so this
# notebook, which runs as a regression test, compares the table's facts below rather than
# the table itself.

# %% tags=["nbval-ignore-output"]
%wb status

# %%
states = {row["rank"]: row["state"] for row in cluster.status()}
print("rank 1:", states[1], "  rank 0 alive:", states[0] != "dead")

# %% [markdown]
# ## 3. Recover: replace the dead engine, roll back, resume
#
# The process group is now broken on *every* rank — rank 0 still holds sockets to a peer
# that no longer exists. Recovery therefore has three parts:
#
# 1. start **one** new engine and give it rank 1's number (rank 0 keeps its engine, its
#    process and its namespace — on a real cluster, the healthy nodes stay);
# 2. re-create the process group on a fresh port, on every rank;
# 3. rebuild the training run and **load the last checkpoint** on every rank: the
#    half-done step 4 is thrown away, and the run continues from the end of step 3.
#
# With a training run on the cluster, `%wb restart` does all three (without one, or with
# `--full`, it stops and starts the whole cluster instead):

# %%
%wb restart

# %%
print("rank 0 kept its engine and process:", cluster.ranks[0].engine_id == old_engine[0]
      and cluster.ranks[0].pid == old_pid[0])
print("rank 1 has a new engine:", cluster.ranks[1].engine_id != old_engine[1]
      and cluster.ranks[1].pid != old_pid[1])
print("cluster state:", cluster.state)
print("run is back at the end of step", stepper.session.step_index)

# %%
%wb status

# %% [markdown]
# Nothing about step 4 survived: the events recorded after the checkpoint were dropped
# too, so the loss curve has three points. Finish steps 4–6:

# %%
stepper.run(3)


def losses(events):
    return [e.value for e in events if e.kind == "metric" and e.name == "loss" and e.rank == 0]


resumed = losses(stepper.events)
print("loss points:", len(resumed))

# %% [markdown]
# Is this the *same* training run as one that never crashed? Build a second run with the
# same options on the same two ranks, run six steps without interruption, and compare
# loss by loss (the engines hold one run at a time, so the stepper's run is closed first):

# %%
from workbench.session.training import TrainingSession

stepper.close()
uninterrupted = TrainingSession(cluster, stepper.spec)
uninterrupted.run(6)
reference = losses(uninterrupted.events)
uninterrupted.close()

for step, (a, b) in enumerate(zip(resumed, reference, strict=True), start=1):
    print(f"step {step}: recovered {a:.5f}   uninterrupted {b:.5f}")
print("max |Δloss| <= 1e-6:", max(abs(a - b) for a, b in zip(resumed, reference)) <= 1e-6)

# %% [markdown]
# Identical: the checkpoint restored weights, optimizer state, the data position and the
# random-number states, so steps 4–6 were computed from exactly the same inputs. The only
# cost of the crash was the work since the last checkpoint (here, the data phase of one
# step) plus the time to start one engine. That trade-off is the checkpoint interval: save
# often and a crash loses little, but every save costs I/O time.
#
# The stepper can do both on its own: `checkpoint_every=N` saves every N steps (keeping
# the newest `keep_last`), and `stepper.run(n, recover=True)` recovers from a dead engine
# or a hung collective by itself and keeps going until it reaches the step it was asked
# for — the elastic recovery the seed article asks for, in miniature.
#
# ### What faults cost, and how often to checkpoint
#
# How often is "often"? The planner answers with this run's own measurements: the time of
# a step, of the save (each save records its seconds on every rank), of the detection (the
# `elapsed` we timed above) and of the recovery (`%wb restart`, up to the checkpoint
# loaded). They vary from run to run, so this cell's output is not compared:

# %% tags=["nbval-ignore-output"]
times = workbench.fault_times(stepper, detect_s=elapsed)
print(f"step {times.step_s:.3f} s, save {times.save_s:.3f} s, "
      f"detect {times.detect_s:.3f} s, recover {times.recover_s:.2f} s")

# %% [markdown]
# Per hour of training, faults cost the saves, the work redone since the last checkpoint
# (half an interval on average) and the detection and recovery of each failure. Save
# rarely and each failure throws away more; save often and the saves themselves add up.
# With these times on 1,000 nodes that each fail once in five years on average (a failure
# every 44 hours somewhere), the curve over checkpoint intervals:

# %% tags=["nbval-ignore-output"]
from workbench.planner import best_checkpoint_every, young_daly_interval_s
from workbench.plots.fault_cost import fault_cost_figure

mtbf_h, nodes = 5 * 365 * 24, 1000
intervals = sorted({max(1, round(10 ** (k / 8))) for k in range(41)})  # 1 .. 100,000 steps
curve = [times.cost(every, mtbf_h, nodes) for every in intervals]
young = young_daly_interval_s(times.save_s, mtbf_h, nodes)
fault_cost_figure(curve, young_daly_s=young)

# %% [markdown]
# The total's lowest point sits at Young and Daly's classic interval, `sqrt(2 · save ·
# MTBF)`: detection and recovery are paid once per failure whatever the interval, so they
# lift the curve without moving its minimum.

# %%
best = best_checkpoint_every(step_s=times.step_s, save_s=times.save_s, mtbf_node_h=mtbf_h,
                             nodes=nodes)
lowest = min(curve, key=lambda c: c.total_s)
print("best interval within one step of Young/Daly:", abs(best * times.step_s - young) <= times.step_s)
print("lowest point of the curve next to it:", abs(lowest.checkpoint_every / best - 1) < 0.34)
print("every step costs more:", curve[0].total_s > times.cost(best, mtbf_h, nodes).total_s)
print("every 100,000 steps costs more:", curve[-1].total_s > times.cost(best, mtbf_h, nodes).total_s)

# %% [markdown]
# ## 4. A collective that one rank never joins
#
# A dead engine is the easy case: its process is gone, and the controller notices. Harder
# is a rank that is alive but never calls the collective — here rank 0 calls
# `all_reduce` and rank 1 does not. Rank 0 waits; nothing has *died*, so only a timeout
# can end the wait. `%%wb --timeout 2` gives the cell two seconds (the cell is expected to
# fail). First, remember which engines run the ranks now:

# %%
pids_before_hang = [r.pid for r in cluster.ranks]

# %% tags=["raises-exception"]
%%wb --timeout 2
import torch
if rank == 0:
    dist.all_reduce(torch.ones(8))

# %% [markdown]
# How can the workbench know what rank 0 is doing while it is blocked and cannot answer?
# Every engine runs a small status thread that writes, out of band, the step, the phase
# and any collective in flight to a file; the hang report reads those files. The same
# information is in the error's `report`:

# %%
import sys

hang = sys.last_value
report = hang.report
print("error:", type(hang).__name__)
print("still running:", report["pending"], "  finished:", report["finished"])
for rank, flight in report["waiting"].items():
    print(
        f"rank {rank} waits in {flight['op']} of {flight['bytes']} bytes "
        f"(group of {flight['group_size']}, issued by {flight['source']})"
    )
print("ranks that never entered it:", report["never_entered"])
print("cluster state:", cluster.state, "  stuck ranks:", cluster.stuck_ranks)

# %% [markdown]
# 32 bytes is the tensor of eight float32 ones. Rank 0 is *stuck*: its engine is alive but
# blocked inside gloo, and it cannot even answer the controller. `%wb restart` recovers in
# two stages. First it tries to **free** the stuck rank without losing its engine: it
# interrupts the rank, and the healthy rank leaves the process group: it tears the group
# down and cuts the group's connections at the socket, so the blocked all-reduce fails at
# once ("connection closed by peer"). Cutting the sockets is what works here: the training
# run above wrapped its model in DDP, and DDP keeps a gloo group, and its connections,
# alive after the group is destroyed, so destroying it alone would leave rank 0 waiting
# until the group's timeout. Only a rank still blocked ten seconds later has its engine
# **killed and replaced**, exactly like a dead one. Either way the process group is then
# re-created on a fresh port.

# %%
%wb restart

# %%
print("rank 0 kept its engine:", cluster.ranks[0].pid == pids_before_hang[0])
print("rank 1 kept its engine:", cluster.ranks[1].pid == pids_before_hang[1])
print("cluster state:", cluster.state, "  stuck ranks:", cluster.stuck_ranks)

# %% [markdown]
# Both ranks join the collective now:

# %%
%%wb --timeout 30
t = torch.ones(8)
dist.all_reduce(t)
print("sum of ones over the ranks:", t[0].item())

# %% [markdown]
# ## 5. Lose a rank and keep going with fewer — then grow back
#
# Replacing the dead engine needs somewhere to start it. When a whole host is gone there is
# nowhere, and the run can instead go on with the ranks that are left (torchelastic's
# `--nnodes MIN:MAX`, torchft's surviving replica groups). What must not change is the
# **global batch**: it is what the optimizer sees. So with fewer data-parallel ranks each
# takes a bigger share, cut into more gradient-accumulation micro-batches, and the next
# step takes the next global batch of the same shuffled order.
#
# First one more rank: `%wb grow 1` starts a third engine and re-forms the process group
# with it as rank 2.

# %%
%wb grow 1

# %% [markdown]
# A run with `elastic=True`, global batch 6 over three ranks (two samples each) and a
# checkpoint every 3 steps. After three steps we kill rank 2's engine in step 4:

# %%
from workbench.parallel import RunSpec

spec = RunSpec(model="gpt-tiny", strategy="dp", batch_size=6)
run = TrainingSession(
    cluster, spec, checkpoint_dir=Path(workdir, "elastic"), checkpoint_every=3, elastic=True
)
run.run(3)
run.phase()  # step 4, phase "data"
os.kill(cluster.ranks[2].pid, signal.SIGKILL)
try:
    run.step()
except workbench.EngineDied as exc:
    print("error:", type(exc).__name__, "  dead ranks:", exc.ranks)

# %% [markdown]
# `run.recover()` (`%wb restart --shrink` for the stepper) drops rank 2 instead of replacing
# it, re-forms the group with two ranks, rebuilds the run there and loads the step-3
# checkpoint into it (DCP reshards it). The global batch stays 6: three samples per rank,
# in three micro-batches of one.

# %%
print(run.recover().replace(workdir, "<workdir>"))
print("world size:", cluster.world_size, "  ranks:", [r.rank for r in cluster.ranks])
print("global batch:", run.spec.batch_size, "  gradient accumulation:", run.spec.grad_accum)
run.run(3)  # steps 4-6 on two ranks; a checkpoint at step 6

# %% [markdown]
# Grow back: `run.grow(1)` (`%wb grow 1`) adds a rank at a checkpoint boundary and loads the
# step-6 checkpoint at three ranks, back to the options the run started with.

# %%
print(run.grow(1).replace(workdir, "<workdir>"))
run.run(3)  # steps 7-9 on three ranks
shrunk = losses(run.events)
run.close()

plain = TrainingSession(cluster, spec)
plain.run(9)
never_shrunk = losses(plain.events)
plain.close()
for step, (a, b) in enumerate(zip(shrunk, never_shrunk, strict=True), start=1):
    print(f"step {step}: 3 -> 2 -> 3 ranks {a:.5f}   always 3 ranks {b:.5f}")
print("max |Δloss| <= 1e-5:", max(abs(a - b) for a, b in zip(shrunk, never_shrunk)) <= 1e-5)

# %% [markdown]
# ## 6. Debug the rank that failed
#
# A traceback says where a rank failed; a debugger lets you look around there. In
# JupyterLab, after a `%%wb` cell failed on rank 1, type `%wb debug` (or
# `%wb debug --rank 1`): pdb opens on rank 1 at the failing frame, and you type its
# commands (`p scale`, `up`, `q`) into the input box under a `[rank 1] (Pdb)` prompt.
# `breakpoint()` in a `%%wb` cell pauses its rank at the same kind of prompt.
#
# This notebook runs under nbclient as a regression test, where no one can type: so the
# failing cell is sent with `cluster.execute` (it returns each rank's error instead of
# stopping the notebook), and the pdb commands come from a list, through the same channel
# the notebook's input box answers (`cluster.debug(on_prompt=...)`).

# %%
results = cluster.execute(
    "import torch.distributed as dist\n"
    "rank = dist.get_rank()\n"
    "def step(batch):\n"
    "    scale = 7 * (rank + 1)\n"
    "    if rank == 1:\n"
    "        raise ValueError(f'bad batch {batch}')\n"
    "    return scale\n"
    "step(3)\n"
)
for r in results:
    print(f"rank {r.rank}:", "ok" if r.ok else f"{r.ename}: {r.evalue}")


# %%
class Typed:
    """Answers pdb's prompts from a list, as a person would type them."""

    def __init__(self, lines):
        self.lines = list(lines)

    def why_not(self):
        return None  # someone can "type": the list

    def ask(self, rank, output, prompt):
        self.show(rank, output)
        line = self.lines.pop(0)
        print(prompt + line)
        return line

    def show(self, rank, output):
        for text in output.splitlines():
            if not text.startswith("> "):  # the frame's file: a temporary name per run
                print(text)


print(cluster.debug(on_prompt=Typed(["p rank", "p scale", "p batch", "q"])))

# %% [markdown]
# The failed frame is kept on rank 1 until the next cell runs there. In JupyterLab,
# `breakpoint()` in a `%%wb` cell stops its rank at a `[rank 1] (Pdb)` prompt (`c`
# continues). Here, under nbclient, no one can type: the breakpoint is never skipped
# silently, it fails that rank's cell and says how to debug instead (the cell is expected
# to fail).

# %% tags=["raises-exception"]
%%wb --ranks 1
y = 41
breakpoint()
print(y + 1)

# %% [markdown]
# **What we saw.** A killed engine is detected at once and reported with the rank and what
# the run was doing; a rank that never joins a collective is caught by a timeout, and the
# report names the waiting rank, the operation, its size and the rank that never came.
# Either way the process group is broken on every rank, and recovery re-creates it —
# replacing only the engines that are gone or cannot be freed. With a checkpoint, the run
# rolls back and continues to the very same losses as an uninterrupted one. On one
# machine, "restart the process" is the whole story; on many, this is what restarting
# means.

# %%
import shutil

shutil.rmtree(workdir)
print("checkpoint directory removed:", not Path(workdir).exists())

# %%
%wb stop
