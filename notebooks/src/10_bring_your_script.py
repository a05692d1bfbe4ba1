
# %% [markdown]
# # 10 · Bring your script
#
# The usual way in: a training script that runs on one device, and the three changes the
# seed article lists for moving it to data parallelism — **(1)** initialise the process
# group, **(2)** give every rank its own part of the data with a `DistributedSampler`,
# **(3)** wrap the model in `DistributedDataParallel`. Each change is made to the file on
# its own and the file is run on two ranks with `%wb run`, exactly as `torchrun` would run
# it, so what each change does is seen before the next. The finished script is then
# traced, compared with the one-device run, and exported to a `torchrun` command and an
# `sbatch` script that run it without a notebook.

# %%
%load_ext workbench

# %%
%wb start -n 2

# %% [markdown]
# ## 1. The one-device script
#
# Plain PyTorch, nothing distributed. It writes its losses to `OUT.RANK` (`RANK` is `0`
# when it runs alone), so the runs below can be compared number for number.

# %%
import difflib
import json
import tempfile
from pathlib import Path

SINGLE = '''\
import argparse, json, os
import torch
from torch.utils.data import DataLoader, TensorDataset

parser = argparse.ArgumentParser()
parser.add_argument("--batch", type=int, default=8, help="global batch size")
parser.add_argument("--out", required=True)
args = parser.parse_args()

g = torch.Generator().manual_seed(0)
inputs = torch.randn(64, 6, generator=g)
targets = inputs @ torch.randn(6, 1, generator=g)
dataset = TensorDataset(inputs, targets)
dataloader = DataLoader(dataset, batch_size=args.batch, shuffle=False)

torch.manual_seed(0)
model = torch.nn.Sequential(torch.nn.Linear(6, 16), torch.nn.Tanh(), torch.nn.Linear(16, 1))
optimizer = torch.optim.SGD(model.parameters(), lr=0.05)

losses = []
for x, y in dataloader:
    optimizer.zero_grad()
    loss = torch.nn.functional.mse_loss(model(x), y)
    loss.backward()
    optimizer.step()
    losses.append(loss.item())

with open(f"{args.out}.{os.environ.get('RANK', '0')}", "w") as f:
    json.dump(losses, f)
print(f"{len(losses)} steps on {len(dataloader.dataset)} samples, last loss {losses[-1]:.4f}")
'''

folder = Path(tempfile.mkdtemp())
out = folder / "losses"


def write(name, text, before=None):
    """Save a version of the script; show what changed since ``before``."""
    path = folder / name
    path.write_text(text)
    if before is not None:
        diff = difflib.unified_diff(before.splitlines(), text.splitlines(), lineterm="", n=0)
        print("\n".join(line for line in diff if not line.startswith(("---", "+++"))))
    return path


def losses(rank=0):
    return json.loads(Path(f"{out}.{rank}").read_text())


single = write("train.py", SINGLE)

# %% [markdown]
# Run on one rank, it is the reference every later run is held to:

# %%
%wb run --ranks 0 {single} --out {out}
one_device = losses()

# %% [markdown]
# ## 2. Change 1: the process group
#
# `init_process_group` is the first line a distributed script needs. On the engines it
# *adopts* the group the cluster already holds (same backend, same world size), so the
# call runs as written.

# %%
STEP1 = SINGLE.replace(
    "args = parser.parse_args()\n",
    'args = parser.parse_args()\ntorch.distributed.init_process_group(backend="gloo")\n',
)
step1 = write("train_1.py", STEP1, before=SINGLE)

# %%
%wb run {step1} --out {out}
print("rank 0 == rank 1 == one device:", losses(0) == losses(1) == one_device)

# %% [markdown]
# Two processes, one group — and the same work done twice: each rank reads the whole data
# set and trains its own copy of the model. Nothing is shared but the group.
#
# ## 3. Change 2: every rank its own data
#
# A `DistributedSampler` hands each rank every second sample (rank 0 the even indices,
# rank 1 the odd ones). The per-rank batch is halved so the *global* batch stays 8 — one
# step still sees the same 8 samples as the one-device step.

# %%
STEP2 = STEP1.replace(
    "dataloader = DataLoader(dataset, batch_size=args.batch, shuffle=False)\n",
    "sampler = torch.utils.data.distributed.DistributedSampler(dataset, shuffle=False)\n"
    "dataloader = DataLoader(dataset, batch_size=args.batch // torch.distributed.get_world_size(), sampler=sampler)\n",
)
step2 = write("train_2.py", STEP2, before=STEP1)

# %%
%wb run {step2} --out {out}
mean = [(a + b) / 2 for a, b in zip(losses(0), losses(1))]
print("ranks differ:", losses(0) != losses(1))
print(f"mean of the ranks vs one device after 8 steps: {abs(mean[-1] - one_device[-1]):.2e}")

# %% [markdown]
# Half the data per rank, but two different models: no gradient crosses between the ranks,
# so each model follows its own half of the data and the pair drifts away from the
# one-device run.
#
# ## 4. Change 3: `DistributedDataParallel`
#
# DDP all-reduces the gradients during `backward`, so every rank takes the same optimizer
# step: the mean gradient over all 8 samples, as on one device.

# %%
STEP3 = STEP2.replace(
    "optimizer = torch.optim.SGD(",
    "model = torch.nn.parallel.DistributedDataParallel(model)\noptimizer = torch.optim.SGD(",
)
ddp = write("train_ddp.py", STEP3, before=STEP2)

# %%
%wb run {ddp} --out {out}
mean = [(a + b) / 2 for a, b in zip(losses(0), losses(1))]
diff = max(abs(a - b) for a, b in zip(mean, one_device))
print(f"mean of the ranks' losses vs one device, every step: max |diff| = {diff:.1e}")
print("equal within 1e-6:", diff <= 1e-6)

# %% [markdown]
# Each rank's loss is over its own 4 samples; their mean is the loss over the global batch,
# step for step the one-device number. That is the whole migration: three changes, each
# visible on its own.
#
# ## 5. Traced
#
# `%wb run --trace` records the script's collectives where `wb.traced` records (notebook
# 09): one span per rank named after the script, DDP's bucket all-reduces inside it, and
# the memory of the model the script wrapped in DDP, sampled after every optimizer step.

# %%
%wb run --trace {ddp} --out {out}

# %% tags=["nbval-ignore-output"]
%wb trace plot comm

# %% tags=["nbval-ignore-output"]
%wb trace plot memory

# %% [markdown]
# The numbers behind the figure, from the same log:

# %%
from collections import Counter

log = get_ipython()._workbench_magics.trace_log
comm = [e for e in log.events if e.kind == "comm" and e.rank == 0]
print("rank 0's collectives (op, bytes): count =", dict(Counter((e.op, e.bytes) for e in comm)))
print("gradient bytes:", 4 * (6 * 16 + 16 + 16 + 1))
after_step = [e for e in log.events if e.kind == "memory" and e.rank == 0 and e.label == "optimizer"]
print("after each of the", len(after_step), "steps (params, grads, optimizer state):",
      sorted({(e.params, e.grads, e.optimizer) for e in after_step}))

# %% [markdown]
# One all-reduce per step of exactly the model's gradient bytes (one DDP bucket: the model
# is small), and DDP's start-up when the model was wrapped: the parameters broadcast from
# rank 0 (516 bytes, so every rank starts from the same weights) and a few small messages
# of DDP's own set-up. In memory, the parameters and their gradients hold those 516 bytes
# each and plain SGD keeps no state.
#
# ## 6. From the notebook to the job
#
# `%wb export` (or `wb.export`) writes `torchrun.sh` for one node and `job.sbatch` for a
# Slurm allocation. The script is exported as it is: it is already a `torchrun` script.

# %%
import workbench as wb

job_dir = folder / "job"
job = wb.export(str(ddp), job_dir, args=["--out", str(folder / "job_losses")], procs_per_node=2)
print("torchrun", " ".join(job.torchrun[1:]))

# %% [markdown]
# Run it — no engines, no notebook, torch's own `torchrun` with two processes meeting on
# 127.0.0.1 — and compare with the notebook's run:

# %%
import os
import subprocess

from workbench.parallel.local import free_port

env = {**os.environ, "MASTER_PORT": str(free_port()), "OMP_NUM_THREADS": "1"}
done = subprocess.run(["bash", str(job.files["torchrun"])], env=env, capture_output=True, text=True, timeout=300)
print("exit code:", done.returncode)
exported = [json.loads(Path(f"{folder / 'job_losses'}.{r}").read_text()) for r in (0, 1)]
under_wb_run = [losses(0), losses(1)]
gap = max(abs(a - b) for mine, theirs in zip(exported, under_wb_run) for a, b in zip(mine, theirs))
print(f"both ranks' losses vs %wb run: max |diff| = {gap:.1e}, within 1e-6: {gap <= 1e-6}")

# %% [markdown]
# For two nodes with four GPUs each: `srun` starts one `torchrun` per node, and they meet
# at the allocation's first node.

# %%
big = wb.export(str(ddp), folder / "job-2x4", args=["--out", "losses"], nodes=2, procs_per_node=4, gpus=True)
for line in big.files["sbatch"].read_text().splitlines():
    if line.startswith(("#SBATCH", "MASTER_ADDR", "srun")) or "--nproc" in line:
        print(line)

# %% [markdown]
# A stepper's run is exported the same way (`wb.export(stepper, DIR)`): then `run.json`
# holds its settings and `python -m workbench.parallel.job` rebuilds it, your own model
# imported by name (README, *From the notebook to the batch job*).

# %%
%wb stop
