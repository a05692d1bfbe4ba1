# %%
%load_ext workbench

# %% [markdown]
# `%wb start -n 2` starts two local engines (processes), assigns ranks 0 and 1 and
# initialises the process group on both. Rendezvous and controller listen on loopback only.

# %%
%wb start -n 2

# %% [markdown]
# `%%wb` runs a cell on every rank. `rank`, `world_size`, `device`, `dist` and `torch` are
# predefined. Output comes back grouped by rank, in rank order.
#
# Each rank makes a tensor filled with `rank + 1`; `all_reduce` sums them on every rank:
# 1 + 2 = 3 everywhere. That one call is the heart of data-parallel training — it is how
# gradients computed on different ranks become one.

# %%
%%wb
t = torch.ones(3) * (rank + 1)
print("before:", t.tolist())
dist.all_reduce(t)
print("after: ", t.tolist())

# %% [markdown]
# Run on a subset of ranks with `--ranks`:

# %%
%%wb --ranks 0
print(f"only rank {rank} of {world_size} runs this")

# %% [markdown]
# Variables live on the engines between cells, like in any notebook — each rank has its own.

# %%
%%wb
x = torch.arange(4) + 10 * rank
x

# %% [markdown]
# An error on any rank fails the cell; identical tracebacks from several ranks are shown
# once, headed by the ranks that raised them. (This cell is expected to fail.)

# %% tags=["raises-exception"]
%%wb
if rank == 1:
    raise ValueError(f"something went wrong on rank {rank}")
print("rank", rank, "is fine")

# %% [markdown]
# `%wb status` shows every rank: its engine, host, process id, device, backend and whether it
# is busy.

# %%
%wb status

# %% [markdown]
# The same from plain Python — the magics are thin wrappers over this API:
#
# ```python
# import workbench as wb
# with wb.Cluster(n=2) as cluster:
#     print(cluster.run(torch.distributed.get_rank))   # [0, 1]
# ```
#
# Always stop the cluster when you are done: no engine or controller process is left behind.

# %%
%wb stop
