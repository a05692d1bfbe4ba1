"""Tracing overhead on a hand-written loop: ``wb.traced`` vs the same loop untraced.

Each of 2 gloo ranks builds one user-written model (a small pre-norm transformer defined
here, not a workbench preset; or a Hugging Face tiny Llama when ``transformers`` is
installed), wraps it in DDP and trains it with a plain loop (forward, loss, backward,
optimizer), in segments of a few steps that alternate between two variants:

* untraced: the loop as the user wrote it;
* traced: the same steps inside one ``with Traced(model, optimizer) as t:`` block, the way
  a ``%%wb`` cell traces the loop it runs: the three phases marked (``t.phase``) and
  ``t.step(loss=...)`` each step; MemoryTracer (saved-tensor hooks, a memory sample per
  phase), CommTracer (dispatch-level, DDP's buckets included) and spans.

One model and one optimizer for both variants: the only difference between a traced and
an untraced step is the tracer (two model copies differ in where their tensors lie in
memory, which alone moved a ratio by several percent either way on this machine). Each
traced step is paired with the untraced step at the same position of the neighbouring
segment (segments alternate traced-first / untraced-first, so a slow drift hits both), and
charged an equal share of its block's start and stop; the ratio is the median over the
pairs of the job's step time (the slowest rank's) — robust to the other load on a shared
machine, which lands on single steps. The same pairs with the whole start/stop charged to
every step (a block entered for each step, the worst case) are reported as a note.

    .venv/bin/python -m benchmarks.traced_loop_bench [--quick]
"""

from __future__ import annotations

import math
import time
from typing import Any

from benchmarks.common import BenchResult, Row, Target, median_interval, run_main, spawn_ranks

__all__ = ["NAME", "TITLE", "rank_main", "run"]

NAME = "traced_loop"
TITLE = "Tracing overhead on your own loop: wb.traced vs the same loop untraced"
TARGET_RATIO = 1.05
# Stop adding step pairs once the 90% interval of the median ratio is this narrow (each side).
HALF_WIDTH = 0.015
VARIANTS = ("traced", "untraced")


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


def _timed(fn: Any) -> tuple[float, float]:
    """(wall, cpu) seconds of ``fn()``."""
    t0, c0 = time.perf_counter(), time.process_time()
    fn()
    return time.perf_counter() - t0, time.process_time() - c0


class _Loop:
    """One rank's model, optimizer and batch, and the loop's segments in both variants."""

    def __init__(self, rank: int, kind: str, batch: int, steps: int, quick: bool) -> None:
        import torch
        from torch.nn.parallel import DistributedDataParallel

        from workbench.trace.recorder import Recorder

        torch.set_num_threads(1)
        make, vocab, seq = _build(kind, quick)
        torch.manual_seed(0)
        self.model = DistributedDataParallel(make())
        self.opt = torch.optim.AdamW(self.model.parameters(), lr=1e-3)
        g = torch.Generator().manual_seed(rank)
        self.x = torch.randint(0, vocab, (batch, seq), generator=g)
        self.y = torch.roll(self.x, -1, dims=1)
        self.recorder = Recorder(rank)
        self.steps = steps

    def loss(self) -> Any:
        import torch.nn.functional as F

        out = self.model(self.x)
        logits = getattr(out, "logits", out)
        return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), self.y.reshape(-1))

    def untraced_step(self) -> None:
        loss = self.loss()
        loss.backward()
        self.opt.step()
        self.opt.zero_grad()

    def traced_step(self, t: Any) -> None:
        with t.phase("forward"):
            loss = self.loss()
        with t.phase("backward"):
            loss.backward()
        with t.phase("optimizer"):
            self.opt.step()
            self.opt.zero_grad()
        t.step(loss=loss)

    def segment(self, name: str) -> dict[str, Any]:
        import torch.distributed as dist

        from workbench.trace.traced import Traced

        dist.barrier()  # outside the traced block: the barrier is not traced
        if name == "untraced":
            return {
                "variant": name,
                "steps": [_timed(self.untraced_step) for _ in range(self.steps)],
            }
        t0, c0 = time.perf_counter(), time.process_time()
        with Traced(self.model, self.opt, recorder=self.recorder) as t:
            t1, c1 = time.perf_counter(), time.process_time()
            timed = [_timed(lambda: self.traced_step(t)) for _ in range(self.steps)]
            t2, c2 = time.perf_counter(), time.process_time()
        t3, c3 = time.perf_counter(), time.process_time()
        return {
            "variant": name,
            "steps": timed,
            "start": (t1 - t0, c1 - c0),
            "stop": (t3 - t2, c3 - c2),
        }


def _charged(traced: dict[str, Any], index: int, whole: bool = False) -> list[float]:
    """A traced segment's step times on one clock (0 wall, 1 cpu), each carrying an equal
    share of the block's start and stop (``whole``: all of it, a block entered per step)."""
    block = traced["start"][index] + traced["stop"][index]
    share = block if whole else block / len(traced["steps"])
    return [step[index] + share for step in traced["steps"]]


def _job_ratios(traced: dict[str, Any], untraced: dict[str, Any]) -> list[float]:
    """Wall-clock traced / untraced of the job (the slowest rank, a max all-reduce) for each
    step pair of two segments, a traced step carrying its share of the block's start/stop."""
    import torch
    import torch.distributed as dist

    steps = len(traced["steps"])
    local = _charged(traced, 0) + [wall for wall, _ in untraced["steps"]]
    job = torch.tensor(local, dtype=torch.float64)
    dist.all_reduce(job, op=dist.ReduceOp.MAX)
    values = job.tolist()
    return [t / u for t, u in zip(values[:steps], values[steps:], strict=True)]


def rank_main(
    rank: int, world: int, kind: str, batch: int, steps: int, pairs: tuple[int, int], quick: bool
) -> dict[str, Any]:
    """The (wall, cpu) seconds of every step of every segment on this rank, and of each
    traced block's start and stop. Pairs of segments run (the first a warm-up, left out)
    until the job's ratio is known to ``HALF_WIDTH`` (every rank sees the same all-reduced
    times, so all stop together), at least ``pairs[0]`` and at most ``pairs[1]`` of them."""
    loop = _Loop(rank, kind, batch, steps, quick)
    segments: list[dict[str, Any]] = []
    ratios: list[float] = []
    for i in range(1 + pairs[1]):  # alternately traced-first and untraced-first
        done = {name: loop.segment(name) for name in (VARIANTS if i % 2 == 0 else VARIANTS[::-1])}
        if not i:
            continue
        segments.extend(done.values())
        ratios.extend(_job_ratios(done["traced"], done["untraced"]))
        if i >= pairs[0]:
            low, high = median_interval(ratios)
            if (high - low) / 2 <= HALF_WIDTH:
                break
    n_comm = sum(1 for e in loop.recorder.events if type(e).__name__ == "CommEvent")
    params = sum(p.numel() for p in loop.model.parameters())
    return {"segments": segments, "comm_events": n_comm, "params": params}


def _pairs(per_rank: list[dict[str, Any]]) -> Any:
    """(traced segment, untraced segment) of every rank, pair by pair."""
    segments = [result["segments"] for result in per_rank]
    for i in range(0, len(segments[0]), 2):
        both = [(segs[i], segs[i + 1]) for segs in segments]
        yield [(a, b) if a["variant"] == "traced" else (b, a) for a, b in both]


def _clock(per_rank: list[dict[str, Any]], index: int) -> dict[str, Any]:
    """``summarise`` on one clock (0 wall, 1 cpu)."""
    import statistics

    world = len(per_rank)
    job: dict[str, list[float]] = {"traced": [], "untraced": [], "every_step": []}
    ratios: dict[str, list[float]] = {"job": [], "every_step": []}
    per_rank_ratios: list[list[float]] = [[] for _ in range(world)]
    start_stop: list[float] = []
    for pair in _pairs(per_rank):
        blocks = [t["start"][index] + t["stop"][index] for t, _ in pair]
        start_stop.append(max(blocks))
        charged = [_charged(t, index) for t, _ in pair]
        charged_whole = [_charged(t, index, whole=True) for t, _ in pair]
        for j in range(len(pair[0][0]["steps"])):
            plain = [u["steps"][j][index] for _, u in pair]
            shared = [steps[j] for steps in charged]
            whole = [steps[j] for steps in charged_whole]
            for r in range(world):
                per_rank_ratios[r].append(shared[r] / plain[r])
            job["traced"].append(max(shared))
            job["untraced"].append(max(plain))
            job["every_step"].append(max(whole))
            ratios["job"].append(max(shared) / max(plain))
            ratios["every_step"].append(max(whole) / max(plain))
    med = statistics.median
    return {
        "ratio": med(ratios["job"]),
        "interval": median_interval(ratios["job"]),
        "ratio_every_step": med(ratios["every_step"]),
        "traced_s": med(job["traced"]),
        "untraced_s": med(job["untraced"]),
        "rank_ratio": [med(r) for r in per_rank_ratios],
        "start_stop_s": med(start_stop),
        "pairs": len(ratios["job"]),
    }


def summarise(per_rank: list[dict[str, Any]]) -> dict[str, Any]:
    """Per clock: the median over step pairs of traced / untraced job step time (the
    slowest rank's), a traced step carrying 1/steps of its block's start and stop; the same
    with all of it on every step; each rank's own median ratio; the block's start+stop."""
    return {
        "clocks": {clock: _clock(per_rank, i) for i, clock in enumerate(("wall", "cpu"))},
        "comm_events": [result["comm_events"] for result in per_rank],
    }


def _row(label: str, summary: dict[str, Any]) -> tuple[Row, str]:
    wall, cpu = summary["clocks"]["wall"], summary["clocks"]["cpu"]
    row = Row.compare(
        f"{label} loop step, wb.traced vs untraced (wall, slowest rank, paired median)",
        "ms",
        wall["traced_s"] * 1e3,
        wall["untraced_s"] * 1e3,
        raw_label="untraced",
        target=Target("<=", TARGET_RATIO),
        samples=wall["pairs"],
        ratio=wall["ratio"],
    )
    ranks = ", ".join(f"x{r:.3f}" for r in wall["rank_ratio"])
    events = ", ".join(str(n) for n in summary["comm_events"])
    low, high = wall["interval"]
    note = (
        f"{label}: 90% interval of the ratio {low:.3f}-{high:.3f}; cpu x{cpu['ratio']:.3f}; "
        f"per rank (wall) {ranks}; block start+stop "
        f"{wall['start_stop_s'] * 1e3:.2f} ms; a block entered every step would be "
        f"x{wall['ratio_every_step']:.3f} (cpu x{cpu['ratio_every_step']:.3f}); "
        f"comm events per rank: {events}"
    )
    return row, note


def run(quick: bool = False) -> BenchResult:
    # Segments of `steps` steps; between `pairs[0]` and `pairs[1]` pairs of them.
    steps, pairs, batch = (2, (2, 2), 4) if quick else (5, (10, 30), 8)
    size, layers = (64, 2) if quick else (256, 4)  # as _build makes them
    kinds = ["user"]
    try:
        import transformers  # noqa: F401

        kinds.append("hf")
    except ImportError:
        pass
    result = BenchResult(
        NAME,
        TITLE,
        ran=f"2 gloo ranks, 1 thread each, DDP, AdamW, batch {batch}/rank x seq 64; one model "
        f"trained in segments of {steps} steps, traced and untraced alternately, "
        f"{pairs[0]}-{pairs[1]} pairs of segments (until the ratio's 90% interval is "
        f"+/-{HALF_WIDTH:.3f} wide) after one warm-up pair; a traced segment "
        "is one wb.traced block (its start/stop shared by its steps); "
        f"user = a {layers}-block pre-norm transformer written in the benchmark (dim {size}); "
        "hf = transformers' "
        f"LlamaForCausalLM from a config (hidden {size}, {layers} layers), when installed",
    )
    details: dict[str, Any] = {}
    for kind in kinds:
        per_rank = spawn_ranks(rank_main, (kind, batch, steps, pairs, quick))
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
