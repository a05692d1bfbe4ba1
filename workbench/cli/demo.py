"""``workbench demo``: the main job (see ``workbench.demo``)."""

from __future__ import annotations

import argparse
import sys
from typing import Any

__all__ = ["register"]


def register(subparsers: Any) -> None:
    from workbench.parallel.models import PRESETS
    from workbench.parallel.spec import STRATEGIES

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
    p.add_argument("--model", default="gpt-tiny", choices=sorted(PRESETS))
    p.add_argument("--steps", type=int, default=4, help="optimizer steps per strategy")
    p.add_argument("--batch-size", type=int, default=8, help="global batch size")
    p.add_argument(
        "--strategies",
        default="dp,zero1,fsdp,tp,megatron,pp",
        help=f"comma-separated, from: {', '.join(s for s in STRATEGIES if s != 'single')}",
    )
    p.set_defaults(handler=_run)


def _run(args: argparse.Namespace) -> int:
    from workbench.demo import format_table, run_demo, write_demo_report
    from workbench.errors import ConfigError
    from workbench.parallel.spec import STRATEGIES

    strategies = [s.strip() for s in args.strategies.split(",") if s.strip()]
    bad = [s for s in strategies if s not in STRATEGIES or s in ("single", "dp_tp")]
    if bad or not strategies:
        valid = [s for s in STRATEGIES if s not in ("single", "dp_tp")]
        raise ConfigError(f"--strategies {bad or args.strategies!r} not valid; choose from {valid}")
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
