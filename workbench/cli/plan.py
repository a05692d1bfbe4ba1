"""``workbench plan``: memory, OOM, step time and a recommendation from the command line.

workbench plan --model llama2-7b --gpu a100-80gb --gpus 8 --dp 8 --zero 3
workbench plan --model llama2-7b --gpu h100-80gb --gpus 64 --recommend
workbench plan --params 10e9 --gpu rtx4090 --gpus 4 --zero 3 --json

The flags are declared in ``plan_args``; here they become the planner's specs.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from workbench.cli.plan_args import add_plan_arguments
from workbench.errors import ConfigError, ParallelError
from workbench.files import read_regular
from workbench.planner import (
    GPUS,
    LINKS,
    MODELS,
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

__all__ = ["register", "run"]


def register(subparsers: Any) -> None:
    p = subparsers.add_parser(
        "plan",
        help="predict per-GPU memory, OOM, step time; recommend a layout",
        description="Predict per-GPU memory (weights, gradients, optimizer state, "
        "activations, buffers), whether it fits, the step time and throughput.",
    )
    add_plan_arguments(p)
    p.set_defaults(handler=run)


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


_MAX_PROFILE_BYTES = 1024 * 1024


def _hardware_json(path: Path) -> HardwareSpec:
    """A profile from ``workbench calibrate --out`` (or a bare HardwareSpec dict)."""
    try:  # a profile is a few KiB; a FIFO or /dev/zero is refused, not read
        data = json.loads(read_regular(path, _MAX_PROFILE_BYTES))
    except RecursionError:
        raise ConfigError(f"--hardware-json {path}: nested too deeply to be a profile") from None
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
        zero3_prefetch=args.zero3_prefetch,
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
