
# %% [markdown]
# # 09 · Your own model, your own loop
#
# Notebooks 01–08 ran the workbench's own models. This one brings yours: a model, a data
# set, a loss and an optimizer written in this notebook, stepped under FSDP, tensor
# parallelism with *your* plan and a pipeline cut where *you* say — each checked against
# one device. Then a training loop written by hand, traced with `wb.traced`, a
# Hugging Face model with the tensor-parallel plan its own config ships, a plan at cluster
# scale from one small measurement, and every strategy side by side.

# %%
%load_ext workbench

# %%
%wb start -n 2

# %% [markdown]
# ## 1. A model, data, loss and optimizer — plain PyTorch
#
# Nothing below knows about the workbench. The only habit that matters for tensor
# parallelism is reading the head count from the tensor shape (`view(b, s, -1, hd)`), so a
# rank that holds half of the heads still works.

# %%
import math

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import Dataset

import workbench as wb

VOCAB, SEQ, DIM, HEADS = 32, 8, 16, 2


class Attention(nn.Module):
    def __init__(self):
        super().__init__()
        self.n_heads = HEADS  # stated, so the planner can read it (section 6)
        self.q, self.k, self.v = (nn.Linear(DIM, DIM, bias=False) for _ in range(3))
        self.o = nn.Linear(DIM, DIM)

    def forward(self, x):
        b, s, _ = x.shape
        q, k, v = (p(x).view(b, s, -1, DIM // HEADS).transpose(1, 2) for p in (self.q, self.k, self.v))
        mask = torch.ones(s, s, dtype=torch.bool).triu(1)
        att = (q @ k.transpose(-2, -1) / math.sqrt(DIM // HEADS)).masked_fill(mask, float("-inf"))
        return self.o((att.softmax(-1) @ v).transpose(1, 2).reshape(b, s, -1))


class Block(nn.Module):
    def __init__(self):
        super().__init__()
        self.ln1, self.attn, self.ln2 = nn.LayerNorm(DIM), Attention(), nn.LayerNorm(DIM)
        self.up, self.down = nn.Linear(DIM, 4 * DIM), nn.Linear(4 * DIM, DIM)

    def forward(self, x):
        x = x + self.attn(self.ln1(x))
        return x + self.down(F.gelu(self.up(self.ln2(x))))


class TinyLM(nn.Module):
    def __init__(self):
        super().__init__()
        self.embed = nn.Embedding(VOCAB, DIM)
        self.blocks = nn.ModuleList(Block() for _ in range(2))
        self.norm, self.head = nn.LayerNorm(DIM), nn.Linear(DIM, VOCAB, bias=False)

    def forward(self, x):
        h = self.embed(x)
        for block in self.blocks:
            h = block(h)
        return self.head(self.norm(h))


class NextToken(Dataset):
    """Random windows; the target of each token is its successor modulo the vocabulary."""

    def __init__(self, n=128):
        self.x = torch.randint(0, VOCAB, (n, SEQ), generator=torch.Generator().manual_seed(0))

    def __len__(self):
        return len(self.x)

    def __getitem__(self, i):
        return self.x[i], (self.x[i] + 1) % VOCAB


def make_model():
    return TinyLM()


def loss_fn(logits, targets):
    return F.cross_entropy(logits.reshape(-1, VOCAB), targets.reshape(-1))


def make_opt(params):
    return torch.optim.AdamW(params, lr=1e-2, eps=1e-6)


n_params = sum(p.numel() for p in make_model().parameters())
print(f"TinyLM: {n_params:,} parameters = {4 * n_params:,} bytes in fp32")

# %% [markdown]
# ## 2. Step it under FSDP
#
# `wb.Stepper` takes the factories instead of a preset name. They are defined in this
# notebook, so they travel to the engines pickled by value (cloudpickle, as ipyparallel
# ships functions); every rank calls `make_model()` under the same seed, so every rank — and
# the single-device reference — starts from the same weights. The `Dataset` is sharded over
# the data-parallel ranks with `DistributedSampler`.

# %%
stepper = wb.Stepper(model=make_model, data=NextToken(), loss=loss_fn, optimizer=make_opt,
                     strategy="fsdp", batch_size=8)
stepper.run(3)
events = stepper.events
start = [e for e in events if e.kind == "memory" and e.label == "start"]
for m in start:
    print(f"rank {m.rank} holds {m.params:,} parameter bytes (FSDP: about half of {4 * n_params:,})")
ops = sorted({e.op for e in events if e.kind == "comm" and e.source == "fsdp"})
print("FSDP collectives:", ops)
print("sharding check:", {k: v for k, v in stepper.session.check_sharding().items()
                          if k in ("dp", "disjoint", "complete", "per_dp_rank")})


def same_as_one_device(stepper):
    losses = [e.value for e in stepper.events if e.kind == "metric" and e.rank == 0]
    reference = stepper.reference_losses()
    return max(abs(a - b) for a, b in zip(losses, reference, strict=True)) < 1e-5


print("losses equal the single-device run's (within 1e-5):", same_as_one_device(stepper))

# %% [markdown]
# `stepper` is the same widget as in notebooks 01–04 (Phase ▶, Step ▶▶, Run N, live memory,
# communication and loss figures); display it to drive your model by hand.
#
# ## 3. Parallelism by dimension
#
# Instead of a preset, give each dimension: `dp` with a ZeRO stage (0 = DDP, 1 = sharded
# optimizer, 2/3 = FSDP2), `tp` with a plan *as data*, `pp` with split points *by module
# name*. Preset names are shorthands for these (`fsdp` is `zero=3` over every rank). A plan
# that names a module the model does not have is refused before anything runs, with the
# nearest names:

# %%
try:
    stepper.rebuild(tp=2, tp_plan={"blocks.*.attn.qkv": "colwise"})
except wb.ParallelError as exc:
    print(exc)

# %%
TP_PLAN = {
    "blocks.*.attn.q": "colwise", "blocks.*.attn.k": "colwise", "blocks.*.attn.v": "colwise",
    "blocks.*.attn.o": "rowwise", "blocks.*.up": "colwise", "blocks.*.down": "rowwise",
}
stepper.rebuild(tp=2, tp_plan=TP_PLAN)
stepper.run(3)
print(repr(stepper.session).split(" ranks")[0])
print("TP collectives:", sorted({e.op for e in stepper.events if e.kind == "comm"}))
print("losses equal the single-device run's (within 1e-5):", same_as_one_device(stepper))

# %% [markdown]
# A pipeline: stage 1 begins at `blocks.1`. Stage 0 runs `embed, blocks.0`; stage 1 runs
# `blocks.1, norm, head`; activations travel between them point to point.

# %%
stepper.rebuild(pp=2, pp_split=["blocks.1"], microbatches=2)
stepper.run(3)
print(repr(stepper.session).split(" ranks")[0])
print("pipeline collectives:", sorted({e.op for e in stepper.events if e.kind == "comm"}))
print("losses equal the single-device run's (within 1e-5):", same_as_one_device(stepper))
stepper.close()

# %% [markdown]
# ## 4. Your own loop, traced
#
# Some work does not fit a stepper: a hand-written loop in a `%%wb` cell. `%wb trace on`
# makes each following cell one traced span; `wb.traced(model, optimizer)` attaches the
# memory and communication tracers to *your* objects and `t.phase(...)` marks phases.

# %%
%wb trace on

# %%
%%wb
import torch
import workbench as wb
from torch.nn.parallel import DistributedDataParallel as DDP

torch.manual_seed(0)
net = DDP(torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.Tanh(), torch.nn.Linear(16, 4)))
opt = torch.optim.SGD(net.parameters(), lr=0.1)
with wb.traced(net, opt) as t:
    for _ in range(3):
        x = torch.randn(4, 8)
        with t.phase("forward"):
            loss = (net(x) ** 2).mean()
        with t.phase("backward"):
            loss.backward()
        with t.phase("optimizer"):
            opt.step()
            opt.zero_grad()
        t.step(loss=loss)
ev = t.recorder.events
buckets = [e for e in ev if e.kind == "comm" and e.source == "ddp-bucket"]
print("DDP all-reduce bytes per step:", sum(e.bytes for e in buckets) // 3,
      "in phase", sorted({e.phase for e in buckets}))
print("parameter bytes:", [e.params for e in ev if e.kind == "memory" and e.label == "start"])

# %%
%wb trace off

# %% [markdown]
# The kernel pulled every rank's events by cursor after the cell; the figures and the
# Perfetto export are the stepper's:

# %% tags=["nbval-ignore-output"]
%wb trace plot memory

# %%
import tempfile

trace_path = f"{tempfile.mkdtemp()}/your_loop.json"  # open it in ui.perfetto.dev
%wb trace export {trace_path}

# %% [markdown]
# ## 5. A Hugging Face model
#
# `transformers` is optional (`pip install distributed-workbench[hf]`). A tiny Llama built
# from a config has random weights — nothing is downloaded — and its config carries a
# tensor-parallel plan (`base_model_tp_plan`) that the workbench reads when no plan is given.

# %%
from workbench.parallel.hf import causal_lm_loss, tiny_llama
from workbench.parallel.parallelize import default_tp_plan

print("plan from the config:", sorted(set(default_tp_plan(tiny_llama()).values())))
hf = wb.Stepper(model=tiny_llama, data=NextToken(), loss=causal_lm_loss, optimizer=make_opt, tp=2)
hf.run(3)
print("losses equal the single-device run's (within 1e-5):", same_as_one_device(hf))
hf.close()

# %% [markdown]
# ## 6. Plan it at scale from a small measurement
#
# `wb.plan_from` counts your model's parameters on the meta device (nothing is allocated),
# measures activation bytes per token per layer from one traced forward at small scale on
# this CPU, and extrapolates per-GPU memory, OOM and step time on a target cluster. Every
# number says whether it was counted, measured or extrapolated:

# %%
planned = wb.plan_from(make_model, data=NextToken(), loss=loss_fn,
                       gpus=8, gpu="h100-80gb", zero=3, seq_len=2048)
print("parameters (counted):", f"{planned.plan.model.n_params:,}")
for row in planned.rows:
    print(f"  {row['quantity']:<42} {row['how'].split(':')[0]}")

# %% [markdown]
# The numbers themselves (the step time is the planner's estimate for an H100, not a
# measurement on this CPU):

# %% tags=["nbval-ignore-output"]
print(planned)

# %% [markdown]
# ## 7. Compare strategies on your model in one call
#
# `wb.compare` runs your model under each strategy (a preset name or a mapping of
# dimensions) on the running cluster, checks each against the single-device run, holds its
# memory and traffic against the planner's prediction from your parameter count, and writes
# the same side-by-side HTML report as `make demo` (with a Perfetto trace per strategy).
# The table holds timings, so it is shown but not compared:

# %% tags=["nbval-ignore-output"]
result = wb.compare(model=make_model, data=NextToken(), loss=loss_fn, optimizer=make_opt,
                    strategies=["dp", "fsdp", {"tp": 2}], tp_plan=TP_PLAN, steps=2,
                    cluster=wb.Cluster.current(), out=tempfile.mkdtemp(), log=lambda line: None)
print(result)

# %%
print("strategies:", [r.strategy for r in result.results])
print("each equals the single-device run (within 1e-5):", result.max_param_diff <= 1e-5)
for r in result.results[:2]:
    rows = {row["category"]: row for row in r.validation["rows"]}
    exact = all(rows[c]["measured"] == rows[c]["predicted"]
                for c in ("weights", "grads", "optimizer", "dp bytes/step"))
    print(f"{r.strategy}: model state and data-parallel bytes equal the planner's to the byte:",
          exact)

# %% [markdown]
# **What we saw.** The workbench steps, measures and checks any `nn.Module` you bring, and
# parallelism is a setting per dimension rather than a menu of presets: the same model ran
# under FSDP, your TP plan and your pipeline split with the single-device losses, a loop you
# wrote yourself was traced into the same figures, and the planner and the side-by-side
# comparison worked from your model's own parameter count.

# %%
%wb stop
