"""Fit the collective cost model (α latency, B bandwidth) to measured (bytes, seconds).

For a ring collective over n ranks, t = c_α·α + c_β·S/B with (c_α, c_β) = (2(n−1),
2(n−1)/n) for all-reduce, ((n−1), (n−1)/n) for all-gather / reduce-scatter and (1, 1) for
point-to-point. That is a straight line t = i + k·S, fitted by least squares on relative
error (weights 1/t²) because sizes span orders of magnitude; then α = i/c_α, B = c_β/k.
"""

from __future__ import annotations

import math
import os
from collections.abc import Iterable
from dataclasses import dataclass

from workbench.errors import ConfigError, choices_error
from workbench.planner.specs import HardwareSpec, LinkSpec, ModelSpec, TrainingSpec

__all__ = ["LinkFit", "cpu_profile", "fit_alpha_beta", "hardware_from_fit"]

_FACTORS = {
    "all_reduce": lambda n: (2.0 * (n - 1), 2.0 * (n - 1) / n),
    "all_gather": lambda n: (float(n - 1), (n - 1) / n),
    "reduce_scatter": lambda n: (float(n - 1), (n - 1) / n),
    "p2p": lambda n: (1.0, 1.0),
}


@dataclass(frozen=True, slots=True)
class LinkFit:
    latency: float  # α, seconds per ring step
    bandwidth: float  # B, bytes/s
    n: int
    op: str
    rms_rel_error: float  # how well the line fits, relative to the measured times
    samples: tuple[tuple[int, float], ...]

    def link(self, name: str = "calibrated") -> LinkSpec:
        return LinkSpec(name=name, bandwidth=self.bandwidth, latency=self.latency)

    def predict(self, size: float) -> float:
        ca, cb = _FACTORS[self.op](self.n)
        return ca * self.latency + cb * size / self.bandwidth

    def as_dict(self) -> dict[str, object]:
        return {
            "latency_s": self.latency,
            "bandwidth_Bps": self.bandwidth,
            "n": self.n,
            "op": self.op,
            "rms_rel_error": self.rms_rel_error,
            "samples": [list(s) for s in self.samples],
        }


def fit_alpha_beta(
    samples: Iterable[tuple[float, float]], *, n: int = 2, op: str = "all_reduce"
) -> LinkFit:
    """α and B from (bytes, seconds) pairs of a collective over ``n`` ranks."""
    if op not in _FACTORS:
        raise choices_error("op", op, tuple(_FACTORS))
    if isinstance(n, bool) or not isinstance(n, int) or n < 2:
        raise ConfigError(f"n={n!r} is not valid; a collective needs n >= 2 ranks")
    pts = tuple((int(s), float(t)) for s, t in samples)
    for s, t in pts:
        if s < 0 or not t > 0:
            raise ConfigError(f"sample ({s}, {t}) is not valid; bytes >= 0 and seconds > 0")
    if len({s for s, _ in pts}) < 2:
        raise ConfigError("need samples at >= 2 different sizes to fit latency and bandwidth")
    w = [1.0 / (t * t) for _, t in pts]
    sw = sum(w)
    mx = sum(wi * s for wi, (s, _) in zip(w, pts, strict=True)) / sw
    my = sum(wi * t for wi, (_, t) in zip(w, pts, strict=True)) / sw
    sxx = sum(wi * (s - mx) ** 2 for wi, (s, _) in zip(w, pts, strict=True))
    sxy = sum(wi * (s - mx) * (t - my) for wi, (s, t) in zip(w, pts, strict=True))
    slope = sxy / sxx
    intercept = my - slope * mx
    if intercept < 0:  # latency cannot be negative: refit the slope through the origin
        intercept = 0.0
        slope = sum(wi * s * t for wi, (s, t) in zip(w, pts, strict=True)) / sum(
            wi * s * s for wi, (s, _) in zip(w, pts, strict=True)
        )
    if not slope > 0:
        raise ConfigError(
            "times do not grow with size, so no bandwidth can be fitted; "
            "measure larger sizes or more iterations"
        )
    ca, cb = _FACTORS[op](n)
    rel = [(intercept + slope * s - t) / t for s, t in pts]
    return LinkFit(
        latency=intercept / ca,
        bandwidth=cb / slope,
        n=n,
        op=op,
        rms_rel_error=(sum(r * r for r in rel) / len(rel)) ** 0.5,
        samples=pts,
    )


def _ram_bytes() -> int:
    try:
        return int(os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE"))
    except (ValueError, OSError, AttributeError):
        return 8 * 2**30


def hardware_from_fit(
    fit: LinkFit,
    *,
    name: str = "local-gloo",
    memory: int | None = None,
    peak_flops: float = 1e11,
    processes_per_node: int | None = None,
) -> HardwareSpec:
    """A CPU 'hardware' whose links are the fitted ones (one host: intra = inter).

    ``memory`` defaults to the host's RAM; ``peak_flops`` should be a measured matmul rate.
    """
    link = fit.link()
    return HardwareSpec(
        name=name,
        memory=memory or _ram_bytes(),
        peak_flops=peak_flops,
        peak_flops_fp32=peak_flops,
        gpus_per_node=processes_per_node or max(fit.n, 1),
        intra=link,
        inter=link,
        kind="cpu",
    )


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
) -> HardwareSpec:
    """A CPU hardware profile calibrated from one measured step, so plans of CPU ranks
    account for what a dedicated-device model leaves out.

    ``step_s`` is one rank's measured step with ``training`` (its micro-batch, on one
    rank); ``outside_s`` the part of it outside forward and backward (optimizer step,
    dispatch), which does not shrink when the batch is split over more ranks. The compute
    rate is set so that the planner's forward + backward takes ``step_s - outside_s``.
    From a DDP step, ``allreduce_s`` (the gradient all-reduce) and ``exposed_s`` (how much
    of it the step waited for) give the overlap; without them the overlap is 0, which is
    what gloo gets when the ranks compute on the same cores that run the all-reduce.

    ``cores`` and ``background`` describe the host the step was measured on: how many
    cores the ranks share and how many other busy processes compete for them (see
    ``HardwareSpec.core_share``). The measured step ran at the share of one rank,
    s1 = min(1, cores / (1 + background)); the profile stores the rate and the fixed
    time of a whole core (measured rate / s1, ``outside_s`` · s1), so a plan with more
    ranks per node than free cores stretches them by its own, smaller share.

    ``ddp_step_s`` is one measured DDP step (wall seconds) of ``ddp_ranks`` ranks with
    ``ddp_micro_batch`` samples each, on the same host: what it took beyond the
    profile's compute and fixed time (at the ranks' share) is the CPU work of the
    gradient all-reduce, stored as ``comm_cpu`` = that work per second of the fitted
    all-reduce time, which ``step_time`` then charges every DP step (not hidden,
    stretched by 1/share). Measure it at another batch than the one to be predicted.
    """
    from workbench.planner.timing import compute_efficiency, executed_flops_per_token

    for label, value in (("step_s", step_s), ("outside_s", outside_s)):
        if not isinstance(value, int | float) or not math.isfinite(value) or value < 0:
            raise ConfigError(f"{label}={value!r} is not valid; it must be seconds >= 0")
    if not 0 <= outside_s < step_s:
        raise ConfigError(
            f"outside_s={outside_s!r} is not valid; it must be >= 0 and < step_s={step_s!r}"
        )
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
    if ddp_step_s is None and ddp_micro_batch is None:
        return profile
    return profile.with_(
        comm_cpu=_ddp_comm_cpu(
            profile, model, training, seq, ddp_step_s, ddp_micro_batch, ddp_ranks
        )
    )


def _ddp_comm_cpu(
    profile: HardwareSpec,
    model: ModelSpec,
    training: TrainingSpec,
    seq: int,
    step_s: float | None,
    micro_batch: int | None,
    ranks: int,
) -> float:
    """CPU seconds per second of fitted all-reduce time that one measured DDP step
    spent beyond the profile's compute and fixed time (0 when it spent nothing more)."""
    from workbench.planner.specs import ParallelSpec
    from workbench.planner.timing import step_time

    if step_s is None or micro_batch is None:
        raise ConfigError(
            f"ddp_step_s={step_s!r}, ddp_micro_batch={micro_batch!r}: a DDP calibration "
            "needs both (the step's wall seconds and its samples per rank)"
        )
    if not isinstance(step_s, int | float) or not math.isfinite(step_s) or step_s <= 0:
        raise ConfigError(f"ddp_step_s={step_s!r} is not valid; it must be seconds > 0")
    for label, value in (("ddp_micro_batch", micro_batch), ("ddp_ranks", ranks)):
        low = 2 if label == "ddp_ranks" else 1
        if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= 2**20:
            raise ConfigError(f"{label}={value!r} is not valid; it must be an integer >= {low}")
    # The same step without the collective's CPU work (comm_cpu = 0), at the ranks' share.
    bare = step_time(
        model,
        training.with_(micro_batch=micro_batch),
        ParallelSpec(dp=ranks),
        profile.with_(comm_cpu=0.0),
        seq=seq,
        micro_batches=1,
    )
    share = profile.core_share(min(ranks, profile.gpus_per_node))
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
