"""Tracing overhead on a hand-written loop: ``wb.traced`` vs the same loop untraced.

Each of 2 gloo ranks builds the same user-written model twice (a small pre-norm
transformer defined here, not a workbench preset; or a Hugging Face tiny Llama when
``transformers`` is installed), wraps each copy in DDP, and runs a plain loop step by step
(forward, loss, backward, optimizer), the two variants interleaved in rotating order:

* untraced: the loop as the user wrote it;
* traced: the same step inside ``with Traced(model, optimizer) as t:`` with the three
  phases marked (``t.phase``) and ``t.step(loss=...)``: MemoryTracer (saved-tensor hooks,
  a memory sample per phase), CommTracer (dispatch-level, DDP's buckets included) and spans. The
  block is entered and left every step so the untraced steps run without tracers; that
  start/stop cost is included (a loop traced as a whole pays it once).

    .venv/bin/python -m benchmarks.traced_loop_bench [--quick]
"""

from __future__ import annotations

import math
import time
from typing import Any

from benchmarks.common import BenchResult, Row, Target, run_main, spawn_ranks
from benchmarks.trace_tp import summarise

__all__ = ["NAME", "TITLE", "rank_main", "run"]

NAME = "traced_loop"
TITLE = "Tracing overhead on your own loop: wb.traced vs the same loop untraced"
TARGET_RATIO = 1.05
VARIANTS = ("untraced", "traced")


def _user_model(dim: int, blocks: int, vocab: int, seq: int) -> Any:
    """A model written the way a user writes one (nothing in it knows the workbench)."""
    import torch
    import torch.nn.functional as F
    from torch import nn

    class Attention(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.heads = 4
            self.qkv = nn.Linear(dim, 3 * dim)
            self.out = nn.Linear(dim, dim)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            b, s, _ = x.shape
            q, k, v = self.qkv(x).view(b, s, 3, self.heads, -1).permute(2, 0, 3, 1, 4)
            scores = q @ k.transpose(-2, -1) / math.sqrt(q.shape[-1])
            mask = torch.ones(s, s, dtype=torch.bool).triu(1)
            y = scores.masked_fill(mask, float("-inf")).softmax(-1) @ v
            return self.out(y.transpose(1, 2).reshape(b, s, -1))

    class Block(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.ln1, self.attn = nn.LayerNorm(dim), Attention()
            self.ln2 = nn.LayerNorm(dim)
            self.up, self.down = nn.Linear(dim, 4 * dim), nn.Linear(4 * dim, dim)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            x = x + self.attn(self.ln1(x))
            return x + self.down(F.gelu(self.up(self.ln2(x))))

    class LM(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.embed = nn.Embedding(vocab, dim)
            self.pos = nn.Parameter(torch.zeros(seq, dim))
            self.blocks = nn.ModuleList(Block() for _ in range(blocks))
            self.norm, self.head = nn.LayerNorm(dim), nn.Linear(dim, vocab, bias=False)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            h = self.embed(x) + self.pos[: x.shape[1]]
            for block in self.blocks:
                h = block(h)
            return self.head(self.norm(h))

    return LM()


def _build(kind: str, quick: bool) -> tuple[Any, int, int]:
    """(model factory, vocab, seq) of ``kind``: 'user' or 'hf'."""
    if kind == "hf":
        from workbench.parallel.hf import tiny_llama

        size = 64 if quick else 256

        def make() -> Any:
            return tiny_llama(
                hidden_size=size,
                intermediate_size=4 * size,
                num_hidden_layers=2 if quick else 4,
                num_attention_heads=4,
                num_key_value_heads=2,
                vocab_size=512,
                max_position_embeddings=128,
            )

        return make, 512, 64
    dim, blocks = (64, 2) if quick else (256, 4)
    return (lambda: _user_model(dim, blocks, 512, 64)), 512, 64


def rank_main(
    rank: int, world: int, kind: str, batch: int, repeats: int, warmup: int, quick: bool
) -> dict[str, Any]:
    """Per-variant (wall, cpu) seconds of one step of the hand-written loop on this rank."""
    import torch
    import torch.distributed as dist
    import torch.nn.functional as F
    from torch.nn.parallel import DistributedDataParallel

    from workbench.trace.recorder import Recorder
    from workbench.trace.traced import Traced

    torch.set_num_threads(1)
    make, vocab, seq = _build(kind, quick)
    models, optimizers = {}, {}
    for name in VARIANTS:
        torch.manual_seed(0)
        models[name] = DistributedDataParallel(make())
        optimizers[name] = torch.optim.AdamW(models[name].parameters(), lr=1e-3)
    g = torch.Generator().manual_seed(rank)
    x = torch.randint(0, vocab, (batch, seq), generator=g)
    y = torch.roll(x, -1, dims=1)
    recorder = Recorder(rank)

    def loss_of(out: Any) -> Any:
        logits = getattr(out, "logits", out)
        return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), y.reshape(-1))

    def untraced() -> None:
        model, opt = models["untraced"], optimizers["untraced"]
        loss = loss_of(model(x))
        loss.backward()
        opt.step()
        opt.zero_grad()

    def traced() -> None:
        model, opt = models["traced"], optimizers["traced"]
        with Traced(model, opt, recorder=recorder) as t:
            with t.phase("forward"):
                loss = loss_of(model(x))
            with t.phase("backward"):
                loss.backward()
            with t.phase("optimizer"):
                opt.step()
                opt.zero_grad()
            t.step(loss=loss)

    steps = {"untraced": untraced, "traced": traced}
    times: dict[str, list[tuple[float, float]]] = {name: [] for name in VARIANTS}
    order = list(VARIANTS)
    for i in range(warmup + repeats):
        shift = i % len(order)
        for name in order[shift:] + order[:shift]:
            dist.barrier()
            t0, c0 = time.perf_counter(), time.process_time()
            steps[name]()
            elapsed = (time.perf_counter() - t0, time.process_time() - c0)
            if i >= warmup:
                times[name].append(elapsed)
    n_comm = sum(1 for e in recorder.events if type(e).__name__ == "CommEvent")
    params = sum(p.numel() for p in models["traced"].parameters())
    return {"times": times, "comm_events": n_comm, "errors": [], "params": params}


def _row(label: str, summary: dict[str, Any]) -> tuple[Row, str]:
    ranks = summary["ranks"]
    worst = max(range(len(ranks)), key=lambda r: ranks[r]["wall"]["ratio"]["traced"])
    med = ranks[worst]["wall"]["median_s"]
    row = Row.compare(
        f"{label} loop step, wb.traced vs untraced (wall, worst rank)",
        "ms",
        med["traced"] * 1e3,
        med["untraced"] * 1e3,
        raw_label="untraced",
        target=Target("<=", TARGET_RATIO),
        samples=ranks[worst]["samples"],
    )
    parts = [
        f"rank {r} {clock}: x{rank[clock]['ratio']['traced']:.3f}"
        for r, rank in enumerate(ranks)
        for clock in ("wall", "cpu")
    ]
    events = ", ".join(str(rank["comm_events"]) for rank in ranks)
    return row, f"{label}: " + "; ".join(parts) + f"; comm events per rank: {events}"


def run(quick: bool = False) -> BenchResult:
    repeats, warmup, batch = (3, 1, 4) if quick else (15, 3, 8)
    kinds = ["user"]
    try:
        import transformers  # noqa: F401

        kinds.append("hf")
    except ImportError:
        pass
    result = BenchResult(
        NAME,
        TITLE,
        ran=f"2 gloo ranks, 1 thread each, DDP, AdamW, batch {batch}/rank x seq 64, variants "
        f"interleaved in rotating order, {repeats} steps each after {warmup} warm-up; "
        "user = a 4-block pre-norm transformer written in the benchmark (dim 256); hf = "
        "transformers' LlamaForCausalLM from a config (hidden 256, 4 layers), when installed; "
        "the traced block is entered every step (its start/stop cost included)",
    )
    details: dict[str, Any] = {}
    for kind in kinds:
        per_rank = spawn_ranks(rank_main, (kind, batch, repeats, warmup, quick))
        summary = summarise(per_rank)
        row, note = _row("user model" if kind == "user" else "HF Llama", summary)
        result.rows.append(row)
        result.notes.append(note + f"; {per_rank[0]['params']:,} parameters")
        details[kind] = summary
    if "hf" not in kinds:
        result.notes.append("HF row skipped: transformers is not installed")
    result.details = details
    return result


if __name__ == "__main__":
    raise SystemExit(run_main(run))
