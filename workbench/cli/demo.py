"""``workbench demo``: the main job (see ``workbench.demo``)."""

from __future__ import annotations

import argparse
import sys
from typing import Any

__all__ = ["register"]


def register(subparsers: Any) -> None:
    from workbench.parallel.models import PRESETS
    from workbench.parallel.run_spec import STRATEGIES

    p = subparsers.add_parser(
        "demo",
        help="run one model under every strategy and write an HTML report",
        description=(
            "Start 2 local engines, run the same model under every strategy with tracing, "
            "check each against the single-device run, and write an HTML report and "
            "Perfetto traces."
        ),
    )
    p.add_argument("--out", default="reports/demo", help="output directory")
    p.add_argument(
        "--model",
        default="gpt-tiny",
        help=f"a built-in model ({', '.join(sorted(PRESETS))}) or your own model's factory "
        "as package.module:factory (then --data and --loss too)",
    )
    p.add_argument("--data", help="your model's data: package.module:dataset_or_factory")
    p.add_argument("--loss", help="your model's loss: package.module:loss_fn")
    p.add_argument("--optimizer", help="your optimizer factory (default AdamW, lr 1e-3)")
    p.add_argument("--steps", type=int, default=4, help="optimizer steps per strategy")
    p.add_argument("--batch-size", type=int, default=8, help="global batch size")
    p.add_argument(
        "--strategies",
        default=None,
        help=f"comma-separated, from: {', '.join(s for s in STRATEGIES if s != 'single')} "
        "(default: dp,zero1,fsdp,tp,megatron,pp; for your own model dp,zero1,fsdp,pp)",
    )
    p.set_defaults(handler=_run)


def _run(args: argparse.Namespace) -> int:
    from workbench.demo import format_table, run_demo, write_demo_report
    from workbench.errors import ConfigError
    from workbench.parallel.models import PRESETS
    from workbench.parallel.run_spec import STRATEGIES

    if ":" in args.model:
        return _run_user(args)
    if args.model not in PRESETS:
        raise ConfigError(
            f"--model {args.model!r} is not valid; choose from {sorted(PRESETS)} or give "
            "your own factory as package.module:factory"
        )
    given = args.strategies if args.strategies is not None else "dp,zero1,fsdp,tp,megatron,pp"
    strategies = [s.strip() for s in given.split(",") if s.strip()]
    bad = [s for s in strategies if s not in STRATEGIES or s in ("single", "dp_tp")]
    if bad or not strategies:
        valid = [s for s in STRATEGIES if s not in ("single", "dp_tp")]
        raise ConfigError(f"--strategies {bad or given!r} not valid; choose from {valid}")
    if args.steps < 1:
        raise ConfigError(f"--steps {args.steps} is not valid; it must be >= 1")
    results = run_demo(
        model=args.model,
        strategies=strategies,
        steps=args.steps,
        batch_size=args.batch_size,
        log=lambda line: print(line, file=sys.stderr, flush=True),
    )
    report = write_demo_report(results, args.out, steps=args.steps, model=args.model)
    print(format_table([r.summary(args.steps) for r in results]))
    worst = max(r.check["max_param_diff"] for r in results if r.check)
    print(f"\nevery strategy matches the single-device run: max |Δparam| = {worst:.2e}")
    print(f"report: {report}")
    print(f"traces: {report.parent}/trace_<strategy>.json")
    return 0 if worst <= 1e-5 else 1


def _load(flag: str, path: str | None, *, required: bool = True) -> Any:
    """``package.module:attr`` imported here (the engines import it too)."""
    import importlib

    from workbench.errors import ConfigError

    if path is None:
        if required:
            raise ConfigError(
                f"{flag} is missing: your own model needs --data and --loss as package.module:attr"
            )
        return None
    module_name, _, attr = path.partition(":")
    if not module_name or not attr:
        raise ConfigError(f"{flag} {path!r} is not valid; give package.module:attr")
    try:
        obj: Any = importlib.import_module(module_name)
        for part in attr.split("."):
            obj = getattr(obj, part)
    except (ImportError, AttributeError) as exc:
        raise ConfigError(f"{flag} {path!r} could not be imported: {exc}") from None
    return obj


def _run_user(args: argparse.Namespace) -> int:
    """``workbench demo --model package.module:factory``: ``wb.compare`` on that model."""
    from workbench.compare import USER_STRATEGIES, compare
    from workbench.errors import ConfigError

    if args.steps < 1:
        raise ConfigError(f"--steps {args.steps} is not valid; it must be >= 1")
    model = _load("--model", args.model)
    data = _load("--data", args.data)
    loss = _load("--loss", args.loss)
    optimizer = _load("--optimizer", args.optimizer, required=False)
    strategies = (
        [s.strip() for s in args.strategies.split(",") if s.strip()]
        if args.strategies is not None
        else list(USER_STRATEGIES)
    )
    result = compare(
        model=model,
        data=data,
        loss=loss,
        optimizer=optimizer,
        strategies=strategies,
        steps=args.steps,
        batch_size=args.batch_size,
        out=args.out,
        log=lambda line: print(line, file=sys.stderr, flush=True),
    )
    print(result)
    print(f"traces: {args.out}/trace_<strategy>.json")
    return 0 if result.max_param_diff <= 1e-5 else 1
