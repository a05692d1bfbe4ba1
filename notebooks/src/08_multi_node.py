# %% [markdown]
# # 08 · Many hosts: running the same notebook on a cluster
#
# Everything so far ran two engines on this machine. The workbench runs the same
# notebooks — the same `%wb start`, `%%wb` cells and steppers — on engines spread over
# several hosts, because ipyparallel already knows how to start engines elsewhere. This
# notebook explains what changes between one host and many, runs the parts that can run
# here (rank assignment for a made-up two-host layout, the checks to make on every rank),
# and ends with the checklist the seed article's migration section asks for: network,
# RDMA, and an identical environment on every node.

# %%
%load_ext workbench

# %% [markdown]
# ## 1. Starting engines on other hosts
#
# `%wb start` takes a launcher. `local` (the default) starts engines as child processes of
# the notebook's machine; the other three are ipyparallel's launchers for clusters:
#
# | launcher | how engines start | typical use |
# |---|---|---|
# | `%wb start --launcher ssh --hosts node-a,node-b -n 16` | over `ssh`, engines dealt round-robin to the hosts | a few machines you can ssh into |
# | `%wb start --launcher mpi --hosts node-a,node-b -n 16` | one `mpiexec` running `ipengine --mpi` (needs mpi4py); the hosts become its host file | machines with an MPI installation |
# | `%wb start --launcher slurm -n 16 --partition gpu` | each engine its own 1-task Slurm job, all submitted at once (`--hosts` pin them to those nodes), so a dead engine is replaced alone | an HPC cluster's scheduler |
#
# Whatever the launcher, each engine then reports its host name, address, process id,
# GPU count and CPUs, and the workbench assigns ranks from those facts. What the
# workbench does differently for the three multi-node launchers:
#
# - **The controller listens on the address that reaches the hosts** (the interface that
#   routes to them, or `--network-interface`), so engines on other hosts can register.
#   With `local` it binds to loopback only — nothing on this machine is reachable from
#   the network.
# - **`MASTER_ADDR` is rank 0's address on that network**, not 127.0.0.1 and not what its
#   hostname resolves to (stock Debian maps it to 127.0.1.1). Before the process group
#   starts, every rank connects to rank 0 on it: an unreachable address is an error
#   naming it and the fix, within seconds.
# - **Launcher options** pass straight through: `--remote-python` (default: this kernel's
#   interpreter path), `--ssh-args`, `--hostfile`, `--mpi-args`, `--partition`, `--time`,
#   `--account`, `--sbatch-args`, `--network-interface` (or `launcher_options={...}`).
# - **Clocks**: engines on other hosts get a measured clock offset so their phases and
#   collectives line up on one timeline.
#
# The settings are validated before anything starts — for example, ssh without hosts:

# %%
import workbench

try:
    workbench.Cluster(n=4, launcher="ssh")
except workbench.ConfigError as exc:
    print("ConfigError:", exc)
try:
    workbench.Cluster(n=4, launcher="pbs")
except workbench.ConfigError as exc:
    print("ConfigError:", exc)

# %% [markdown]
# ## 2. Rank assignment for two hosts
#
# `workbench.cluster.assign_ranks` is a pure function from engine facts to ranks, so we
# can feed it a layout we do not have. Four engines on two made-up hosts with two GPUs
# each; engines register in whatever order they happen to start, so their ids interleave
# across the hosts:

# %%
from workbench.cluster import EngineInfo, assign_ranks

engines = [
    EngineInfo(engine_id=0, host="node-b", pid=201, address="10.0.0.12", cuda_devices=2, cpus=32),
    EngineInfo(engine_id=1, host="node-a", pid=101, address="10.0.0.11", cuda_devices=2, cpus=32),
    EngineInfo(engine_id=2, host="node-b", pid=202, address="10.0.0.12", cuda_devices=2, cpus=32),
    EngineInfo(engine_id=3, host="node-a", pid=102, address="10.0.0.11", cuda_devices=2, cpus=32),
]
ranks = assign_ranks(engines, backend="auto", master_port=29500)
print(f"{'rank':<5}{'engine':<8}{'host':<8}{'node':<6}{'local':<7}{'device':<9}{'backend':<9}master")
for r in ranks:
    print(
        f"{r.rank:<5}{r.engine_id:<8}{r.host:<8}{r.node_rank:<6}{r.local_rank:<7}"
        f"{r.device:<9}{r.backend:<9}{r.master_addr}"
    )

# %% [markdown]
# - Ranks are **grouped by host**, hosts in the order of their lowest engine id: `node-b`
#   registered engine 0 first, so it is node 0 and holds ranks 0 and 1. Contiguous ranks
#   per host is what `torchrun` does, and what tensor parallelism needs: a TP group of
#   neighbouring ranks stays inside one node, on NVLink (notebook 03).
# - `local_rank` numbers the engines within a host and picks the GPU: `cuda:LOCAL_RANK`.
# - `backend="auto"` chose **NCCL** because every host has a GPU per engine.
# - `MASTER_ADDR` is rank 0's address, reachable from the other node.
#
# Each engine gets these as the usual `torchrun` environment variables before it joins the
# process group, so code that reads them finds what `torchrun` would have set. A whole
# `torchrun` script runs unchanged with `%wb run train.py ARGS` (`cluster.run_script`): its
# `init_process_group(...)` adopts the cluster's group, which its `destroy_process_group()`
# leaves alone (README, *Your torchrun script, unchanged*). The variables of rank 2:

# %%
for key, value in ranks[2].env().items():
    print(f"{key}={value}")

# %% [markdown]
# A mismatch is caught before any process group forms — here three engines on a host with
# two GPUs, and NCCL requested explicitly:

# %%
crowded = [*engines, EngineInfo(engine_id=4, host="node-a", pid=103, address="10.0.0.11", cuda_devices=2)]
try:
    assign_ranks(crowded, backend="nccl")
except workbench.ClusterError as exc:
    print("ClusterError:", exc)

# %% [markdown]
# On one host the same function keeps everything on loopback:

# %%
local = [EngineInfo(engine_id=i, host="this-machine", pid=300 + i) for i in range(2)]
for r in assign_ranks(local):
    print(f"rank {r.rank}: {r.backend} on {r.device}, MASTER_ADDR={r.master_addr}")

# %% [markdown]
# ## 3. The same checks, on real engines
#
# Start the two local engines as before. `%wb status` lists every rank's engine, host,
# process id, device, backend and state — on a multi-node cluster this is the first
# thing to look at:

# %%
%wb start -n 2

# %%
%wb status

# %% [markdown]
# Every rank sees the environment the assignment gave it:

# %%
%%wb
import os

keys = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "GROUP_RANK", "MASTER_ADDR")
print(" ".join(f"{k}={os.environ[k]}" for k in keys))
print("backend:", dist.get_backend(), "device:", device)

# %% [markdown]
# The seed article's second migration warning — "ensure environment consistency across
# nodes" — is what the cluster doctor checks. Every engine reported its environment as it
# registered (Python, PyTorch with its git hash, CUDA, cuDNN and NCCL where CUDA is there,
# the workbench, numpy, transformers, any package named with `--check-packages`, GPUs,
# CPUs and the `NCCL_*`/`GLOO_*`/`OMP_*` variables), and the start compared them: a
# different PyTorch, CUDA, NCCL, workbench or Python minor version on one host would have
# failed the start, naming the hosts and both versions, before any process group formed.
# `%wb doctor env` asks again and shows one row per host, differences highlighted; here,
# in numbers:

# %%
cluster = workbench.Cluster.current()
report = cluster.doctor("env")
print("hosts:", len(report.rows), "| fields that differ:", sorted(report.differences()))
print("errors:", report.errors, "| warnings:", report.warnings)

# %% [markdown]
# The network, measured pair by pair: `doctor("net")` runs a small ping-pong (latency:
# half the round trip, median and p99) and large messages one way and both ways between
# every pair of ranks, one pair at a time, then an all-reduce sweep inside each host,
# across hosts and over the world (nccl-tests' bus bandwidth). A pair below 0.75x the
# median bandwidth is flagged; the slowest link is named. The heatmap has one cell per
# pair (on this machine, one pair over loopback; its numbers change from run to run):

# %%
net = cluster.doctor("net")
print(net.chosen, "->", len(net.pairs), "pair(s), slow pairs:", len(net.slow))
print("all-reduce groups fitted:", len(net.fits))

# %%
# NBVAL_IGNORE_OUTPUT
from workbench.plots.network import network_figure

network_figure(net)

# %% [markdown]
# The fitted links become the planner's hardware, so a plan is made for the cluster you
# have: `cluster.measured_hardware()` (or `measured_hardware(base=hardware_preset("h100-80gb"))`
# to keep a GPU's compute and memory) goes to `workbench.plan`, `plan_from(gpu=...)` and the
# planner widget. One host has no inter-host link, so there the intra-host one stands in:

# %%
hw = cluster.measured_hardware()
print(hw.intra.name, "|", hw.inter.name)

# %% [markdown]
# ## 4. NCCL and the network: what to check before a long run
#
# On GPUs the workbench uses NCCL, one GPU per engine. NCCL picks its transport by
# itself: NVLink/NVSwitch between GPUs of one node, and between nodes InfiniBand or RoCE
# with GPUDirect RDMA when it finds them — or, silently, plain TCP sockets when it does
# not, which can be many times slower (notebook 05 shows what that does to scaling
# efficiency). A checklist, in the order problems usually show up:
#
# 1. **Reachability.** Every engine host must reach the controller (its ports are in the
#    connection file) and rank 0's `MASTER_ADDR:MASTER_PORT`; NCCL opens further ports
#    between all pairs of hosts. Firewalls between nodes are the usual reason a process
#    group "hangs" at start-up — the workbench bounds that wait (`%wb start --timeout`).
# 2. **The right interface.** Hosts often have several (management Ethernet, IB, Docker
#    bridges). `NCCL_SOCKET_IFNAME=ib0` (or `eth1`, ...) and `GLOO_SOCKET_IFNAME` pin the
#    one to use; `NCCL_IB_HCA` selects InfiniBand adapters.
# 3. **RDMA actually in use.** `NCCL_DEBUG=INFO` in the engines' environment makes NCCL
#    log the transport it chose (`NET/IB` vs `NET/Socket`); `ibv_devinfo` shows the
#    adapters. Then measure: `%wb doctor net` on the cluster, and compare each pair's and
#    each group's bus bandwidth with the link's rating.
# 4. **Non-blocking topology.** The switch fabric must carry every node's traffic at once
#    (the seed's "交换机带宽是否无阻塞"); a bandwidth sweep on 2 nodes and on all nodes
#    shows whether it does.
# 5. **Same environment everywhere.** Python, PyTorch, CUDA and NCCL versions (checked at
#    every start; `%wb doctor env` shows them), the same code (a shared file system or the same container image), and the
#    same data paths; checkpoints on storage every node can read.
#
# With these in place a multi-node run is the same notebook with a different
# `%wb start` line.

# %%
%wb stop
