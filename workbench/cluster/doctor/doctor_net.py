"""The cluster doctor's network check, in the kernel: run ``engine/doctor_net.py`` on every
rank and turn its times into a report (pairs, slow links, all-reduce bus bandwidth, the
fitted links) and a ``HardwareSpec`` for the planner.
"""

from __future__ import annotations

import html
import statistics
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from workbench import validate
from workbench.cluster.ranks import RankAssignment
from workbench.engine.doctor_net import probe_network
from workbench.planner.calibrate import LinkFit
from workbench.planner.network_fit import (
    SLOW_SHARE,
    PairMeasure,
    all_reduce_busbw,
    choose_pairs,
    fit_groups,
    slow_pairs,
    sweep_groups,
)


class RunsOnRanks(Protocol):
    """What the network check needs of a cluster: its ranks and a way to run on them
    (a ``Cluster``; named here, not imported, so that ``cluster.py`` may import this)."""

    @property
    def ranks(self) -> list[RankAssignment]: ...

    def run(self, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> list[Any]: ...


__all__ = ["NetOptions", "NetworkReport", "measure_network"]

KIB = 1024
MIB = 1024 * KIB


@dataclass(frozen=True, slots=True)
class NetOptions:
    """How much to measure. The defaults keep ``%wb doctor`` on a local 2-rank cluster
    well under 10 s; raise ``iters`` / ``bandwidth_iters`` / ``sweep_iters`` for steadier
    numbers."""

    iters: int = 200  # ping-pongs per pair, after a tenth as many to warm up
    bandwidth_bytes: int = 8 * MIB
    bandwidth_iters: int = 5
    sweep_sizes: tuple[int, ...] = (4 * KIB, 64 * KIB, 1 * MIB, 8 * MIB)
    sweep_iters: int = 10
    all_pairs_up_to: int = 16  # ranks; beyond, host pairs and one pair per host

    @classmethod
    def checked(cls, **options: Any) -> NetOptions:
        """The options, each checked in the project's message style, before any work."""
        known = set(cls.__slots__)  # type: ignore[attr-defined]
        for name in options:
            if name not in known:
                raise validate.invalid(
                    "option", name, "it is not a network option", f"one of {sorted(known)}"
                )
        values = dict(options)
        for name, low, high in (
            ("iters", 1, 100_000),
            ("bandwidth_bytes", 4, 2**34),
            ("bandwidth_iters", 1, 10_000),
            ("sweep_iters", 1, 10_000),
            ("all_pairs_up_to", 2, 4096),
        ):
            if name in values:
                values[name] = validate.integer(name, values[name], minimum=low, maximum=high)
        if "sweep_sizes" in values:
            sizes = values["sweep_sizes"]
            if isinstance(sizes, str | bytes) or not isinstance(sizes, Sequence):
                raise validate.invalid(
                    "sweep_sizes", sizes, "it is not a list of sizes", "e.g. [4096, 1048576]"
                )
            values["sweep_sizes"] = tuple(
                validate.integer("sweep_sizes", s, minimum=4, maximum=2**34) for s in sizes
            )
            if len(set(values["sweep_sizes"])) < 2:
                raise validate.invalid(
                    "sweep_sizes",
                    sizes,
                    "a latency and a bandwidth need two different sizes",
                    "at least two different sizes in bytes",
                )
        return cls(**values)


@dataclass(slots=True)
class NetworkReport:
    """Every measured pair, the slow ones, the all-reduce sweeps and their fitted links."""

    world_size: int
    hosts: list[str]
    chosen: str  # how the pairs were chosen
    pairs: list[PairMeasure]
    sweeps: dict[str, list[tuple[float, float]]]  # group -> (bytes, seconds) per size
    group_sizes: dict[str, int]
    fits: dict[str, LinkFit] = field(default_factory=dict)

    @property
    def slow(self) -> list[PairMeasure]:
        return slow_pairs(self.pairs)

    @property
    def slowest(self) -> PairMeasure | None:
        return min(self.pairs, key=lambda p: p.one_way) if self.pairs else None

    def busbw(self) -> dict[str, list[tuple[float, float]]]:
        """group -> (bytes, bus bandwidth in bytes/s) per size (nccl-tests' formula)."""
        return {
            label: [(s, all_reduce_busbw(self.group_sizes[label], s, t)) for s, t in rows]
            for label, rows in self.sweeps.items()
        }

    def summary(self) -> str:
        lines = [f"{len(self.pairs)} pair(s), one at a time ({self.chosen})"]
        slowest = self.slowest
        if slowest is not None:
            lines.append(
                f"slowest link: rank {slowest.a} ({self.hosts[slowest.a]}) <-> rank "
                f"{slowest.b} ({self.hosts[slowest.b]}) at {slowest.one_way / 1e9:.3g} GB/s"
            )
        for p in self.slow:
            lines.append(f"slow: ranks {p.a}-{p.b} below {SLOW_SHARE}x the median pair's bandwidth")
        for label, fit in self.fits.items():
            lines.append(
                f"{label}: all-reduce fit {fit.bandwidth / 1e9:.3g} GB/s busbw, "
                f"latency {fit.latency * 1e6:.3g} us"
            )
        return "\n".join(lines)

    def __repr__(self) -> str:
        return f"<NetworkReport {self.world_size} ranks>\n{self.summary()}"

    def rows(self) -> list[dict[str, Any]]:
        slow = {(p.a, p.b) for p in self.slow}
        return [
            {
                "pair": f"{p.a}-{p.b}",
                "hosts": "same host" if p.same_host else "across hosts",
                "latency median (us)": p.latency * 1e6,
                "latency p99 (us)": p.latency_p99 * 1e6,
                "one way (GB/s)": p.one_way / 1e9,
                "both ways (GB/s)": p.both_ways / 1e9,
                "slow": (p.a, p.b) in slow,
            }
            for p in self.pairs
        ]

    def _repr_html_(self) -> str:
        rows = self.rows()
        if not rows:
            return f"<pre>{html.escape(self.summary())}</pre>"
        head = "".join(f"<th>{html.escape(k)}</th>" for k in rows[0])
        body = "".join(
            "<tr>" + "".join(f"<td>{_cell(v)}</td>" for v in row.values()) + "</tr>" for row in rows
        )
        return f"<table><tr>{head}</tr>{body}</table><pre>{html.escape(self.summary())}</pre>"


def _cell(value: Any) -> str:
    if isinstance(value, float):
        return f"{value:.3g}"
    return html.escape(str(value))


def _mean_rows(per_rank: Sequence[Sequence[Sequence[float]]]) -> list[tuple[float, float]]:
    """The ranks' times for each size, averaged across ranks (nccl-tests' ``-a``)."""
    return [
        (float(rows[0][0]), statistics.fmean(float(r[1]) for r in rows))
        for rows in zip(*per_rank, strict=True)
    ]


def measure_network(
    cluster: RunsOnRanks, options: NetOptions, timeout: float = 600.0
) -> NetworkReport:
    """Run the probes on every rank at once and build the report."""
    hosts = [r.host for r in cluster.ranks]
    pairs, chosen = choose_pairs(hosts, options.all_pairs_up_to)
    groups = sweep_groups(hosts)
    results = cluster.run(
        probe_network,
        [list(p) for p in pairs],
        groups,
        iters=options.iters,
        bandwidth_bytes=options.bandwidth_bytes,
        bandwidth_iters=options.bandwidth_iters,
        sweep_sizes=list(options.sweep_sizes),
        sweep_iters=options.sweep_iters,
        timeout=timeout,
    )
    measured = [
        PairMeasure.from_times(a, b, hosts[a] == hosts[b], times)
        for result in results
        for times in result["pairs"]
        for a, b in [times["pair"]]
    ]
    sweeps = {
        label: _mean_rows([r["sweeps"][label] for r in results if label in r["sweeps"]])
        for label in groups
    }
    sizes = {label: len(members) for label, members in groups.items()}
    return NetworkReport(
        world_size=len(hosts),
        hosts=hosts,
        chosen=chosen,
        pairs=sorted(measured, key=lambda p: (p.a, p.b)),
        sweeps=sweeps,
        group_sizes=sizes,
        fits=fit_groups(sweeps, sizes),
    )
