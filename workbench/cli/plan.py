"""``workbench plan``: memory, OOM, step time and a recommendation from the command line.

workbench plan --model llama2-7b --gpu a100-80gb --gpus 8 --dp 8 --zero 3
workbench plan --model llama2-7b --gpu h100-80gb --gpus 64 --recommend
workbench plan --params 10e9 --gpu rtx4090 --gpus 4 --zero 3 --json
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from workbench.cli.numbers import count, real
from workbench.errors import ConfigError, ParallelError
from workbench.planner import (
    GPUS,
    LINKS,
    MODELS,
    OPTIMIZERS,
    PRECISIONS,
    RECOMPUTE,
    HardwareSpec,
    ModelSpec,
    ParallelSpec,
    TrainingSpec,
    evaluate,
    format_plan,
    hardware_preset,
    model_preset,
    recommend,
)
from workbench.planner.specs import GRAD_DTYPES, GRAD_SYNC, NORMS, SCHEDULES

__all__ = ["register", "run"]

# Upper bounds keep every flag's arithmetic (and the recommendation's search over the
# divisors of --gpus) finite and quick; they are far above any real model or cluster.
_MAX_DIM = 10**8
_MAX_GPUS = 1 << 20


def register(subparsers: Any) -> None:
    p = subparsers.add_parser(
        "plan",
        help="predict per-GPU memory, OOM, step time; recommend a layout",
        description="Predict per-GPU memory (weights, gradients, optimizer state, "
        "activations, buffers), whether it fits, the step time and throughput.",
    )
    _model_args(p)
    _training_args(p)
    _hardware_args(p)
    _parallel_args(p)
    o = p.add_argument_group("output")
    o.add_argument("--recommend", action="store_true", help="search layouts for --gpus")
    o.add_argument("--json", action="store_true", help="machine-readable output")
    o.add_argument("--list", action="store_true", help="list model, GPU and link presets")
    p.set_defaults(handler=run)


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
    """Batch, precision, optimizer, recompute and what the step stores."""
    t = p.add_argument_group("training")
    t.add_argument("--seq", type=count(1, _MAX_DIM), help="sequence length (default: the model's)")
    t.add_argument("--micro-batch", type=count(1, _MAX_DIM), default=1)
    t.add_argument("--global-batch", type=count(1, _MAX_DIM))
    t.add_argument("--grad-accum", type=count(1, _MAX_DIM))
    t.add_argument("--precision", default="bf16-mixed", help=" | ".join(PRECISIONS))
    t.add_argument("--optimizer", default="adamw", help=" | ".join(OPTIMIZERS))
    t.add_argument("--recompute", default="none", help=" | ".join(RECOMPUTE))
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
    t.add_argument("--flash-attention", action="store_true", help="no s x s scores stored")
    t.add_argument(
        "--fused-swiglu",
        action="store_true",
        help="SwiGLU keeps 3 tensors (gate, up, product), not 4",
    )
    t.add_argument(
        "--selective-overhead",
        type=real(0, 1),
        default=0.05,
        help="time selective recompute adds, as a share of layer compute",
    )
    t.add_argument("--no-dropout", action="store_true")
    t.add_argument(
        "--fp8", action="store_true", help="FP8 matmuls (FP8 weight copy, 1-byte linear inputs)"
    )
    t.add_argument(
        "--offload-optimizer",
        action="store_true",
        help="ZeRO-Offload: fp32 grads, master weights and optimizer state in host memory",
    )
    t.add_argument(
        "--offload-activations",
        action="store_true",
        help="saved activations in host memory (two layers stay on the GPU)",
    )
    t.add_argument(
        "--mfu",
        type=real(0, 1, low_open=True),
        default=None,
        help="one flat compute efficiency for all executed FLOPs (default: the "
        "per-operation model, matmuls at the GPU's efficiency + memory-bound traffic)",
    )
    t.add_argument(
        "--memory-traffic",
        type=real(0, 1000),
        default=None,
        help="memory-bound bytes moved per activation byte (default 5.57 with the "
        "per-operation model, 0 with --mfu)",
    )
    t.add_argument("--overlap", type=real(0, 1), default=1.0)


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


_MODEL_KEYS = (
    "layers", "hidden", "heads", "kv_heads", "ffn", "vocab",
    "tied_embeddings", "bias", "gated_mlp", "norm",
)  # fmt: skip


def _model(args: argparse.Namespace) -> ModelSpec:
    dims = {k: getattr(args, k) for k in _MODEL_KEYS if getattr(args, k) is not None}
    params = round(args.params) if args.params is not None else None
    if args.model:
        spec = model_preset(args.model)
        changes: dict[str, Any] = dict(dims)
        if params is not None:
            changes["params"] = params
        return spec.with_(**changes) if changes else spec
    if params is None and not dims:
        raise ConfigError(f"give --model (one of: {', '.join(MODELS)}) or --params <count>")
    name = f"{params / 1e9:g}B" if params is not None else "custom"
    dims.setdefault("vocab", 32000)
    return ModelSpec(name=name, params=params, seq=2048, **dims)


def _hardware(args: argparse.Namespace) -> HardwareSpec:
    if args.hardware_json is not None:
        hw = _hardware_json(args.hardware_json)
        if args.gpus_per_node:
            hw = hw.with_(gpus_per_node=args.gpus_per_node)
        if args.reserve_gb is not None:
            hw = hw.with_(reserved=_reserved(args.reserve_gb, hw.memory))
        return hw
    kwargs: dict[str, Any] = {
        "intra": args.intra,
        "inter": args.inter,
        "gpus_per_node": args.gpus_per_node,
    }
    if args.reserve_gb is not None:
        kwargs["reserved"] = _reserved(args.reserve_gb, hardware_preset(args.gpu).memory)
    return hardware_preset(args.gpu, **kwargs)


def _reserved(gb: float, memory: int) -> int:
    reserved = round(gb * 1e9)
    if reserved >= memory:
        raise ConfigError(
            f"--reserve-gb {gb:g} is not valid; it must be less than the card's "
            f"{memory / 1e9:.1f} GB"
        )
    return reserved


def _hardware_json(path: Path) -> HardwareSpec:
    """A profile from ``workbench calibrate --out`` (or a bare HardwareSpec dict)."""
    try:
        data = json.loads(path.read_text())
    except (OSError, UnicodeDecodeError, ValueError) as exc:
        reason = exc.strerror if isinstance(exc, OSError) and exc.strerror else str(exc)
        raise ConfigError(f"--hardware-json {path}: cannot read it as JSON ({reason})") from exc
    if isinstance(data, dict) and isinstance(data.get("hardware"), dict):
        data = data["hardware"]
    if not isinstance(data, dict):
        raise ConfigError(
            f"--hardware-json {path}: expected a JSON object (a profile saved by "
            f"workbench calibrate), got {type(data).__name__}"
        )
    try:
        return HardwareSpec.from_dict(data)
    except ConfigError as exc:
        raise ConfigError(f"--hardware-json {path}: {exc}") from exc


def _training(args: argparse.Namespace) -> TrainingSpec:
    return TrainingSpec(
        micro_batch=args.micro_batch,
        global_batch=args.global_batch,
        grad_accum=args.grad_accum,
        seq=args.seq,
        precision=args.precision,
        optimizer=args.optimizer,
        recompute=args.recompute,
        dropout=not args.no_dropout,
        fp32_grads=args.fp32_grads,
        grads=args.grads,
        grad_sync=args.grad_sync,
        flash_attention=args.flash_attention,
        fused_swiglu=args.fused_swiglu,
        selective_overhead=args.selective_overhead,
        fp8=args.fp8,
        offload_optimizer=args.offload_optimizer,
        offload_activations=args.offload_activations,
        trainable=args.trainable,
        mfu=args.mfu,
        memory_traffic=args.memory_traffic,
        overlap=args.overlap,
    )


def _parallel(args: argparse.Namespace) -> ParallelSpec:
    dp = args.dp
    block = args.tp * args.pp * args.cp
    if dp is None:
        if args.gpus is None:
            dp = 1
        elif args.gpus % block:
            raise ParallelError(
                f"--gpus {args.gpus} is not divisible by --tp·--pp·--cp="
                f"{args.tp}·{args.pp}·{args.cp}={block}"
            )
        else:
            dp = args.gpus // block
    layout = ParallelSpec(
        dp=dp,
        tp=args.tp,
        pp=args.pp,
        cp=args.cp,
        zero=args.zero,
        sequence_parallel=args.sp,
        micro_batches=args.micro_batches,
        schedule=args.schedule,
        virtual_stages=args.virtual_stages,
        vocab_parallel=not args.no_vocab_parallel,
        first_stage_layers=args.first_stage_layers,
        last_stage_layers=args.last_stage_layers,
    )
    if args.gpus is not None and layout.world != args.gpus:
        raise ParallelError(
            f"--gpus {args.gpus} but --dp·--tp·--pp·--cp={layout.dp}·{layout.tp}·{layout.pp}·"
            f"{layout.cp}={layout.world}"
        )
    return layout


def _presets() -> dict[str, Any]:
    return {
        "models": {k: v.n_params for k, v in MODELS.items()},
        "gpus": list(GPUS),
        "links": {
            k: {"bandwidth": v.bandwidth, "peak": v.peak, "latency": v.latency, "source": v.source}
            for k, v in LINKS.items()
        },
    }


def run(args: argparse.Namespace) -> int:
    out = sys.stdout
    if args.list:
        presets = _presets()
        if args.json:
            json.dump(presets, out, indent=2)
            out.write("\n")
        else:
            out.write(
                "models: "
                + ", ".join(f"{k} ({v / 1e9:.3g}B)" for k, v in presets["models"].items())
            )
            out.write("\ngpus:   " + ", ".join(presets["gpus"]))
            out.write("\nlinks (achievable busbw / peak, GB/s):")
            for k, v in LINKS.items():
                peak = f"{v.peak / 1e9:g}" if v.peak else "?"
                out.write(f"\n  {k:<8}{v.bandwidth / 1e9:>6g} / {peak:<6} {v.source}")
            out.write("\n")
        return 0
    model = _model(args)
    hardware = _hardware(args)
    training = _training(args)
    if args.recommend:
        gpus = args.gpus if args.gpus is not None else (args.dp or 1) * args.tp * args.pp * args.cp
        rec = recommend(model, hardware, gpus, training)
        if args.json:
            data: dict[str, Any] = {
                "recommended": rec.best.to_dict() if rec.best else None,
                "reasons": list(rec.reasons),
                "considered": rec.considered,
                "fitting": len(rec.ranked),
                "min_gpus": rec.min_gpus,
            }
            json.dump(data, out, indent=2, default=str)
            out.write("\n")
        else:
            out.write("\n".join(rec.reasons) + "\n")
            if rec.best is not None:
                out.write("\n" + format_plan(rec.best) + "\n")
        return 0
    result = evaluate(model, training, _parallel(args), hardware)
    if args.json:
        json.dump(result.to_dict(), out, indent=2, default=str)
        out.write("\n")
    else:
        out.write(format_plan(result) + "\n")
    return 0
