"""A CPU hardware profile calibrated from measured steps, for plans of CPU (gloo) ranks.

A dedicated-device model leaves out what CPU ranks pay: a fixed time per step outside
forward and backward (optimizer step, dispatch), ranks sharing too few cores, and the
CPU work of gloo's all-reduce competing with compute. ``cpu_profile`` measures each
from one rank's step (and optionally one DDP step) and stores it in a ``HardwareSpec``
that ``timing.step_time`` reads:

- the compute rate is set so that the planner's forward + backward of the measured step
  takes ``step_s - outside_s``; ``outside_s`` becomes ``step_overhead``;
- ``cores`` and ``background`` describe the host the step was measured on: how many
  cores the ranks share and how many other busy processes compete for them (see
  ``HardwareSpec.core_share``). The measured step ran at the share of one rank,
  s1 = min(1, cores / (1 + background)); the profile stores the rate and the fixed
  time of a whole core (measured rate / s1, ``outside_s`` · s1), so a plan with more
  ranks per node than free cores stretches them by its own, smaller share;
- from a DDP step, ``allreduce_s`` (the gradient all-reduce) and ``exposed_s`` (how much
  of it the step waited for) give the overlap; without them the overlap is 0, which is
  what gloo gets when the ranks compute on the same cores that run the all-reduce;
- ``ddp_step_s`` is one measured DDP step (wall seconds) of ``ddp_ranks`` ranks with
  ``ddp_micro_batch`` samples each, on the same host: what it took beyond the profile's
  compute and fixed time (at the ranks' share) is the CPU work of the gradient
  all-reduce, stored as ``comm_cpu`` = that work per second of the fitted all-reduce
  time, which ``step_time`` then charges every DP step (not hidden, stretched by
  1/share). Measure it at another batch than the one to be predicted;
- ``ddp_cpu_s`` instead of ``ddp_step_s``: the CPU seconds one rank used in that DDP step
  (process CPU time per step). CPU time does not stretch with the load from other
  processes, so comm_cpu = (ddp_cpu_s - the profile's compute and fixed time at a whole
  core) / the fitted all-reduce time needs no assumption about the share the ranks got
  while it was measured; the wall-time form divides out the share the planner predicts
  for the calibration, and any load that came or went between the calibration and the
  1-engine measurement lands in comm_cpu.

The links come from ``calibrate``'s α-β fit of measured collectives.
"""

from __future__ import annotations

import math

from workbench.errors import ConfigError
from workbench.planner.calibrate import LinkFit, hardware_from_fit
from workbench.planner.compute_time import compute_efficiency
from workbench.planner.flops import executed_flops_per_token
from workbench.planner.specs import HardwareSpec, ModelSpec, ParallelSpec, TrainingSpec
from workbench.planner.timing import step_time

__all__ = ["cpu_profile"]


def cpu_profile(
    fit: LinkFit,
    model: ModelSpec,
    training: TrainingSpec,
    *,
    seq: int,
    step_s: float,
    outside_s: float,
    allreduce_s: float | None = None,
    exposed_s: float | None = None,
    name: str = "local-cpu",
    memory: int | None = None,
    cores: float | None = None,
    background: float = 0.0,
    processes_per_node: int | None = None,
    ddp_step_s: float | None = None,
    ddp_micro_batch: int | None = None,
    ddp_ranks: int = 2,
    ddp_cpu_s: float | None = None,
) -> HardwareSpec:
    """A CPU hardware profile calibrated from one measured step (see the module
    docstring for what each measurement sets).

    ``step_s`` is one rank's measured step with ``training`` (its micro-batch, on one
    rank); ``outside_s`` the part of it outside forward and backward. ``allreduce_s`` and
    ``exposed_s`` (a DDP step's all-reduce and the part of it waited for) give the
    overlap; ``cores`` and ``background`` the host's cores and other busy processes;
    ``ddp_step_s`` (or ``ddp_cpu_s``), ``ddp_micro_batch`` and ``ddp_ranks`` one DDP step
    for ``comm_cpu``.
    """
    _check_step_times(step_s, outside_s)
    overlap = _measured_overlap(allreduce_s, exposed_s)
    tokens = training.micro_batch * seq
    base = hardware_from_fit(
        fit, name=name, memory=memory, processes_per_node=processes_per_node
    ).with_(cores=cores, background=background)
    share = base.core_share(1)  # what the measured single rank got
    rate = executed_flops_per_token(model, training, seq) * tokens / (step_s - outside_s)
    eff = compute_efficiency(training, base)[0]  # the plan will compute at eff x peak
    profile = base.with_(
        peak_flops=rate / share / eff,
        peak_flops_fp32=rate / share / eff,
        max_overlap=overlap,
        step_overhead=float(outside_s) * share,
    )
    if ddp_step_s is None and ddp_micro_batch is None and ddp_cpu_s is None:
        return profile
    if ddp_cpu_s is not None and ddp_step_s is not None:
        raise ConfigError(
            f"ddp_step_s={ddp_step_s!r} and ddp_cpu_s={ddp_cpu_s!r}: give the DDP step "
            "as wall seconds or as CPU seconds, not both"
        )
    cpu = ddp_cpu_s is not None
    measured = ddp_cpu_s if cpu else ddp_step_s
    comm_cpu = _ddp_comm_cpu(
        profile, model, training, seq, measured, ddp_micro_batch, ddp_ranks, cpu=cpu
    )
    return profile.with_(comm_cpu=comm_cpu)


def _check_step_times(step_s: float, outside_s: float) -> None:
    """Both are finite seconds >= 0, and the step is longer than its part outside."""
    for label, value in (("step_s", step_s), ("outside_s", outside_s)):
        if not isinstance(value, int | float) or not math.isfinite(value) or value < 0:
            raise ConfigError(f"{label}={value!r} is not valid; it must be seconds >= 0")
    if not 0 <= outside_s < step_s:
        raise ConfigError(
            f"outside_s={outside_s!r} is not valid; it must be >= 0 and < step_s={step_s!r}"
        )


def _ddp_comm_cpu(
    profile: HardwareSpec,
    model: ModelSpec,
    training: TrainingSpec,
    seq: int,
    step_s: float | None,
    micro_batch: int | None,
    ranks: int,
    *,
    cpu: bool = False,
) -> float:
    """CPU seconds per second of fitted all-reduce time that one measured DDP step
    spent beyond the profile's compute and fixed time (0 when it spent nothing more).
    ``step_s`` is the step's wall seconds, or with ``cpu`` one rank's CPU seconds."""
    label = "ddp_cpu_s" if cpu else "ddp_step_s"
    if step_s is None or micro_batch is None:
        raise ConfigError(
            f"{label}={step_s!r}, ddp_micro_batch={micro_batch!r}: a DDP calibration "
            "needs both (the step's seconds and its samples per rank)"
        )
    if not isinstance(step_s, int | float) or not math.isfinite(step_s) or step_s <= 0:
        raise ConfigError(f"{label}={step_s!r} is not valid; it must be seconds > 0")
    for label, value in (("ddp_micro_batch", micro_batch), ("ddp_ranks", ranks)):
        low = 2 if label == "ddp_ranks" else 1
        if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= 2**20:
            raise ConfigError(f"{label}={value!r} is not valid; it must be an integer >= {low}")
    # The same step without the collective's CPU work (comm_cpu = 0): at the ranks' share
    # for a wall time, at a whole core (what CPU time counts) for CPU seconds.
    hw = profile.with_(comm_cpu=0.0, cores=None) if cpu else profile.with_(comm_cpu=0.0)
    bare = step_time(
        model,
        training.with_(micro_batch=micro_batch),
        ParallelSpec(dp=ranks),
        hw,
        seq=seq,
        micro_batches=1,
    )
    share = 1.0 if cpu else profile.core_share(min(ranks, profile.gpus_per_node))
    return max(0.0, (step_s - bare.total) * share / bare.dp_comm)


def _measured_overlap(allreduce_s: float | None, exposed_s: float | None) -> float:
    """The share of a measured all-reduce hidden behind compute (0 when not measured)."""
    if allreduce_s is None or exposed_s is None:
        return 0.0
    if not (math.isfinite(allreduce_s) and math.isfinite(exposed_s)) or allreduce_s <= 0:
        raise ConfigError(
            f"allreduce_s={allreduce_s!r}, exposed_s={exposed_s!r} are not valid; "
            "give finite seconds, allreduce_s > 0"
        )
    return min(1.0, max(0.0, 1.0 - exposed_s / allreduce_s))
