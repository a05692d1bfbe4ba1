"""The plan against a real single-device fp32 run: model state to the byte, activations
within 10%, measured with saved-tensor hooks the way the tracer does."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from workbench.planner import (
    HardwareSpec,
    LinkSpec,
    ModelSpec,
    TrainingSpec,
    evaluate,
    plan,
    validate,
)
from workbench.planner.specs import ParallelSpec
from workbench.trace import CommEvent, MemorySample, to_record

torch.set_num_threads(1)


class Block(nn.Module):
    """GPT-2 block: LN, QKV, softmax attention with dropout, projection, GeLU MLP."""

    def __init__(self, h: int, a: int, p: float) -> None:
        super().__init__()
        self.a, self.p = a, p
        self.ln1, self.ln2 = nn.LayerNorm(h), nn.LayerNorm(h)
        self.qkv, self.proj = nn.Linear(h, 3 * h), nn.Linear(h, h)
        self.fc1, self.fc2 = nn.Linear(h, 4 * h), nn.Linear(4 * h, h)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, s, h = x.shape
        q, k, v = self.qkv(self.ln1(x)).split(h, dim=-1)
        q, k, v = (t.view(b, s, self.a, h // self.a).transpose(1, 2) for t in (q, k, v))
        att = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(h // self.a))
        att = F.dropout(att.softmax(-1), self.p, self.training)
        y = (att @ v).transpose(1, 2).reshape(b, s, h)
        x = x + F.dropout(self.proj(y), self.p, self.training)
        mlp = self.fc2(F.gelu(self.fc1(self.ln2(x))))
        return x + F.dropout(mlp, self.p, self.training)


class TinyGPT(nn.Module):
    def __init__(self, v: int, s: int, h: int, a: int, layers: int, p: float = 0.1) -> None:
        super().__init__()
        self.p = p
        self.wte, self.wpe = nn.Embedding(v, h), nn.Embedding(s, h)
        self.blocks = nn.ModuleList(Block(h, a, p) for _ in range(layers))
        self.ln_f = nn.LayerNorm(h)
        self.head = nn.Linear(h, v, bias=False)
        self.head.weight = self.wte.weight  # tied

    def forward(self, idx: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        pos = torch.arange(idx.shape[1])
        x = F.dropout(self.wte(idx) + self.wpe(pos), self.p, self.training)
        for block in self.blocks:
            x = block(x)
        logits = self.head(self.ln_f(x))
        return F.cross_entropy(logits.view(-1, logits.shape[-1]), targets.view(-1))


def _bytes(tensors) -> int:
    seen: dict[int, int] = {}
    for t in tensors:
        st = t.untyped_storage()
        seen[st.data_ptr()] = st.nbytes()
    return sum(seen.values())


V, S, H, A, L, B = 256, 64, 64, 4, 3, 2


@pytest.fixture(scope="module")
def measured() -> dict[str, int]:
    torch.manual_seed(0)
    model = TinyGPT(V, S, H, A, L)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    params = list(model.parameters())
    param_ptrs = {p.untyped_storage().data_ptr() for p in params}
    idx = torch.randint(0, V, (B, S))
    saved: dict[int, int] = {}

    def pack(t: torch.Tensor) -> torch.Tensor:
        st = t.untyped_storage()
        if st.data_ptr() not in param_ptrs:
            saved[st.data_ptr()] = st.nbytes()
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        loss = model(idx, idx)
    activations = sum(saved.values())
    loss.backward()
    opt.step()
    moments = [
        v
        for state in opt.state.values()
        for k, v in state.items()
        if k in ("exp_avg", "exp_avg_sq")
    ]
    return {
        "n": sum(p.numel() for p in params),
        "params": _bytes(params),
        "grads": _bytes(p.grad for p in params),
        "optimizer": _bytes(moments),
        "activations": activations,
    }


CPU = HardwareSpec(
    name="cpu",
    memory=8 * 2**30,
    peak_flops=1e10,
    intra=LinkSpec(bandwidth=1e9, latency=1e-4),
    inter=LinkSpec(bandwidth=1e9, latency=1e-4),
    kind="cpu",
)
TRAIN = TrainingSpec(micro_batch=B, seq=S, precision="fp32", optimizer="adamw")


def _plan(n: int):
    model = ModelSpec(
        name="tiny", params=n, layers=L, hidden=H, heads=A, vocab=V, seq=S,
        tied_embeddings=True, bias=True, learned_positions=True,
    )  # fmt: skip
    return evaluate(model, TRAIN, ParallelSpec(), CPU)


def _samples(m: dict[str, int], *, params: int | None = None) -> list[MemorySample]:
    common = dict(rank=0, step=1, t=0)
    return [
        MemorySample(
            **common, phase="forward", params=params or m["params"], grads=0, optimizer=0,
            activations=m["activations"],
        ),
        MemorySample(
            **common, phase="optimizer", params=params or m["params"], grads=m["grads"],
            optimizer=m["optimizer"], activations=0,
        ),
    ]  # fmt: skip


def test_explicit_count_fp32_adamw_is_4_4_8_bytes_per_param(measured):
    p = _plan(measured["n"])
    assert (p.memory.weights, p.memory.grads, p.memory.optimizer) == (
        4 * measured["n"],
        4 * measured["n"],
        8 * measured["n"],
    )


def test_plan_matches_a_real_fp32_run(measured):
    p = _plan(measured["n"])
    report = validate(_samples(measured), p)
    assert report.ok, str(report)
    assert report.row("model state").error == 0.0
    assert report.row("activations").error <= 0.10
    # The same events as to_record dicts give the same report.
    as_dicts = validate([to_record(e) for e in _samples(measured)], p)
    assert as_dicts.rows == report.rows


def test_derived_count_agrees_with_the_real_model(measured):
    model = ModelSpec(
        layers=L, hidden=H, heads=A, vocab=V, seq=S,
        tied_embeddings=True, bias=True, learned_positions=True,
    )  # fmt: skip
    assert model.n_params == measured["n"]


def test_mismatch_is_reported(measured):
    p = _plan(measured["n"])
    report = validate(_samples(measured, params=measured["params"] + 4), p)
    assert not report.ok
    assert not report.row("weights").ok and report.row("activations").ok
    assert "MISMATCH" in str(report)


def test_dp_bytes_from_comm_events():
    p = plan(
        ModelSpec(params=1000, layers=1, hidden=8, heads=1, vocab=10, seq=4),
        CPU, gpus=2, precision="fp32", optimizer="adamw", micro_batch=1,
    )  # fmt: skip
    events = [
        CommEvent(rank=0, step=s, op="all_reduce", bytes=b, group_size=2, start=0, end=10**6,
                  source="ddp-bucket")
        for s in (1, 2) for b in (3000, 1000)
    ]  # fmt: skip
    report = validate(events, p)
    assert report.row("dp bytes/step").measured == 4000 == report.row("dp bytes/step").predicted
    assert report.row("dp comm s/step").measured == pytest.approx(2e-3)
    assert report.ok
