"""Fit the collective cost model (α latency, B bandwidth) to measured (bytes, seconds).

For a ring collective over n ranks, t = c_α·α + c_β·S/B with (c_α, c_β) = (2(n−1),
2(n−1)/n) for all-reduce, ((n−1), (n−1)/n) for all-gather / reduce-scatter and (1, 1) for
point-to-point. That is a straight line t = i + k·S, fitted by least squares on relative
error (weights 1/t²) because sizes span orders of magnitude; then α = i/c_α, B = c_β/k.
"""

from __future__ import annotations

import os
from collections.abc import Iterable
from dataclasses import dataclass

from workbench.errors import ConfigError, choices_error
from workbench.planner.specs import HardwareSpec, LinkSpec

__all__ = ["LinkFit", "fit_alpha_beta", "hardware_from_fit"]

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
