"""The command line of ``workbench plan``: its flags, grouped by topic as ``--help`` shows them.

Only parsing lives here (types and bounds through ``cli.numbers``, so a bad value fails
with one message naming it); ``cli.plan`` turns the parsed flags into the planner's specs.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from workbench.cli.numbers import count, real
from workbench.planner import GPUS, LINKS, MODELS, OPTIMIZERS, PRECISIONS, RECOMPUTE
from workbench.planner.specs import GRAD_DTYPES, GRAD_SYNC, NORMS, SCHEDULES, ZERO3_PREFETCH

__all__ = ["add_plan_arguments"]

# Upper bounds keep every flag's arithmetic (and the recommendation's search over the
# divisors of --gpus) finite and quick; they are far above any real model or cluster.
_MAX_DIM = 10**8
_MAX_GPUS = 1 << 20


def add_plan_arguments(p: argparse.ArgumentParser) -> None:
    """Every flag of ``workbench plan``, one argument group per topic."""
    _model_args(p)
    _training_args(p)
    _activation_args(p)
    _speed_args(p)
    _hardware_args(p)
    _parallel_args(p)
    o = p.add_argument_group("output")
    o.add_argument("--recommend", action="store_true", help="search layouts for --gpus")
    o.add_argument("--json", action="store_true", help="machine-readable output")
    o.add_argument("--list", action="store_true", help="list model, GPU and link presets")


def _model_args(p: argparse.ArgumentParser) -> None:
    """A preset or the model's dimensions."""
    m = p.add_argument_group("model")
    m.add_argument("--model", help=f"preset: {', '.join(MODELS)}")
    m.add_argument("--params", type=real(1, 1e15), help="parameter count, e.g. 10e9")
    for dim in ("layers", "hidden", "heads", "kv-heads", "ffn", "vocab"):
        m.add_argument(f"--{dim}", type=count(1, _MAX_DIM))
    m.add_argument(
        "--tied-embeddings",
        action="store_true",
        default=None,
        help="the head shares the embedding's weights",
    )
    m.add_argument("--bias", action="store_true", default=None, help="linear layers have biases")
    m.add_argument(
        "--gated-mlp",
        action="store_true",
        default=None,
        help="SwiGLU MLP (gate, up, down; --ffn is the inner size)",
    )
    m.add_argument("--norm", choices=NORMS, help="default: the preset's, else layernorm")


def _training_args(p: argparse.ArgumentParser) -> None:
    """Batch, precision, optimizer, gradients and where the optimizer state lives."""
    t = p.add_argument_group("training")
    t.add_argument("--seq", type=count(1, _MAX_DIM), help="sequence length (default: the model's)")
    t.add_argument("--micro-batch", type=count(1, _MAX_DIM), default=1)
    t.add_argument("--global-batch", type=count(1, _MAX_DIM))
    t.add_argument("--grad-accum", type=count(1, _MAX_DIM))
    t.add_argument("--precision", default="bf16-mixed", help=" | ".join(PRECISIONS))
    t.add_argument(
        "--fp8", action="store_true", help="FP8 matmuls (FP8 weight copy, 1-byte linear inputs)"
    )
    t.add_argument("--optimizer", default="adamw", help=" | ".join(OPTIMIZERS))
    t.add_argument(
        "--trainable", type=real(0, 1, low_open=True), default=1.0, help="fraction (LoRA: ~0.01)"
    )
    t.add_argument("--fp32-grads", action="store_true", help="= --grads bf16+fp32")
    t.add_argument(
        "--grads",
        choices=GRAD_DTYPES,
        default="auto",
        help="gradient storage; fp32 alone is the 18 bytes/param accounting",
    )
    t.add_argument(
        "--grad-sync",
        choices=GRAD_SYNC,
        default="per_microbatch",
        help="ZeRO-2/3 gradient reduce-scatter: every micro-batch or once per step",
    )
    t.add_argument(
        "--zero3-prefetch",
        choices=ZERO3_PREFETCH,
        default="layer",
        help="ZeRO-3 weight gathers: a layer ahead, hidden per pass (FSDP), or one "
        "sub-module ahead with a device sync per gather (DeepSpeed v0.3 ZeRO-3)",
    )
    t.add_argument(
        "--offload-optimizer",
        action="store_true",
        help="ZeRO-Offload: fp32 grads, master weights and optimizer state in host memory",
    )


def _activation_args(p: argparse.ArgumentParser) -> None:
    """What each layer keeps for backward, and where."""
    a = p.add_argument_group("activations")
    a.add_argument("--recompute", default="none", help=" | ".join(RECOMPUTE))
    switches = (
        ("--flash-attention", "no s x s scores stored"),
        ("--fused-swiglu", "SwiGLU keeps 3 tensors (gate, up, product), not 4"),
        ("--no-dropout", None),
        ("--offload-activations", "saved activations in host memory (two layers stay on the GPU)"),
    )
    for flag, text in switches:
        a.add_argument(flag, action="store_true", help=text)


def _speed_args(p: argparse.ArgumentParser) -> None:
    """How fast compute runs and how much communication it hides (the step-time model)."""
    e = p.add_argument_group("step-time model")
    numbers = (
        (
            "--mfu",
            real(0, 1, low_open=True),
            None,
            "one flat compute efficiency for all executed FLOPs (default: the per-operation "
            "model, matmuls at the GPU's efficiency + memory-bound traffic)",
        ),
        (
            "--memory-traffic",
            real(0, 1000),
            None,
            "memory-bound bytes moved per activation byte (default 5.57 with the "
            "per-operation model, 0 with --mfu)",
        ),
        (
            "--selective-overhead",
            real(0, 1),
            0.05,
            "time selective recompute adds, as a share of layer compute",
        ),
        ("--overlap", real(0, 1), 1.0, None),
    )
    for flag, kind, default, text in numbers:
        e.add_argument(flag, type=kind, default=default, help=text)


def _hardware_args(p: argparse.ArgumentParser) -> None:
    """The GPU, how many, and the links between them."""
    h = p.add_argument_group("hardware")
    h.add_argument("--gpu", default="a100-80gb", help=f"preset: {', '.join(GPUS)}")
    h.add_argument("--hardware-json", type=Path, help="a profile saved by workbench calibrate")
    h.add_argument("--gpus", type=count(1, _MAX_GPUS), help="total GPUs (default dp·tp·pp)")
    h.add_argument("--gpus-per-node", type=count(1, 1024))
    h.add_argument("--intra", help=f"intra-node link: {', '.join(LINKS)}")
    h.add_argument("--inter", help=f"inter-node link: {', '.join(LINKS)}")
    h.add_argument(
        "--reserve-gb",
        type=real(0, 1e6),
        help="memory kept by the runtime, GB (default 1 GiB); less than the card's memory",
    )


def _parallel_args(p: argparse.ArgumentParser) -> None:
    """Degrees of data, tensor, pipeline and context parallelism; ZeRO stage."""
    x = p.add_argument_group("parallelism")
    x.add_argument("--dp", type=count(1, _MAX_GPUS))
    x.add_argument("--tp", type=count(1, _MAX_GPUS), default=1)
    x.add_argument("--pp", type=count(1, _MAX_GPUS), default=1)
    x.add_argument("--zero", type=int, choices=(0, 1, 2, 3), default=0)
    x.add_argument("--sp", action="store_true", help="sequence parallel (needs tp > 1)")
    x.add_argument("--micro-batches", type=count(1, _MAX_DIM))
    x.add_argument("--schedule", default="1f1b", help=" | ".join(SCHEDULES))
    x.add_argument(
        "--virtual-stages",
        type=count(1, 1024),
        default=1,
        help="interleaved schedule: model chunks per stage (needs --schedule interleaved)",
    )
    x.add_argument("--cp", type=count(1, _MAX_GPUS), default=1, help="context parallel size")
    x.add_argument(
        "--first-stage-layers",
        type=count(1, _MAX_DIM),
        help="layers on the first pipeline stage (uneven stages)",
    )
    x.add_argument(
        "--last-stage-layers",
        type=count(1, _MAX_DIM),
        help="layers on the last pipeline stage (uneven stages)",
    )
    x.add_argument(
        "--no-vocab-parallel",
        action="store_true",
        help="TP keeps the embedding and head whole on every rank",
    )
