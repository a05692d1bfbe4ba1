"""Where a cluster's start-up time goes: kernel-side stages and per-engine milestones.

``Cluster.start`` marks its stages on a ``StartupProfile`` (seconds since the start
request); each engine reports (``workbench.engine.boot.timed_engine_info``) when its
process began, when it was forked from the process that imported torch for it (a local
cluster: engine/zygote.py) and how long its own ``import torch`` took, and the kernel notes
when it registered, answered and joined the process group. ``%wb start
--profile-startup`` prints ``profile.table()`` after the start. Marks cost a clock read
and a dict write, so the profile is always collected (``cluster.startup``).
"""

from __future__ import annotations

import contextlib
import os
import threading
import time
from dataclasses import dataclass, field
from typing import Any

__all__ = ["StartupProfile"]


@dataclass
class StartupProfile:
    """Stage marks (seconds since ``t0``) and per-engine milestones."""

    t0: float = field(default_factory=time.perf_counter)
    t0_wall: float = field(default_factory=time.time)
    stages: dict[str, float] = field(default_factory=dict)
    engines: dict[int, dict[str, float]] = field(default_factory=dict)
    notes: dict[str, float] = field(default_factory=dict)  # seconds measured elsewhere
    remarks: list[str] = field(default_factory=list)  # one line each, after the engines
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    def now(self) -> float:
        return time.perf_counter() - self.t0

    def mark(self, stage: str) -> None:
        self.stages[stage] = self.now()

    def engine(self, engine_id: int, **values: float) -> None:
        """Record milestones of one engine (called from ipyparallel's IO thread too)."""
        with self._lock:
            self.engines.setdefault(engine_id, {}).update(values)

    def engine_now(self, engine_id: int, milestone: str) -> None:
        self.engine(engine_id, **{milestone: self.now()})

    def engine_facts(self, engine_id: int, info: dict[str, Any], same_clock: bool = True) -> None:
        """Fold in what ``timed_engine_info`` reported. The process start is a wall-clock
        time on the engine's host: comparable only where that is this host's clock."""
        facts = info.get("startup") or {}
        created = facts.get("process_created_wall")
        values: dict[str, float] = {"torch_import_s": float(facts.get("torch_import_s", 0.0))}
        forked = facts.get("forked_wall")
        if created is not None and same_clock:
            values["process_started"] = float(created) - self.t0_wall
        if forked is not None and same_clock:
            values["forked"] = float(forked) - self.t0_wall
        self.engine(engine_id, **values)

    def table(self) -> str:
        """A plain-text report: stages in order, then one line per engine."""
        lines = ["start-up profile (seconds since the start request)"]
        for name, seconds in self.notes.items():
            lines.append(f"  {name:<34} {seconds:7.2f} s")
        previous = 0.0
        for name, at in sorted(self.stages.items(), key=lambda kv: kv[1]):
            lines.append(f"  {name:<34} {at:7.2f}   (+{at - previous:.2f})")
            previous = at
        columns = [
            ("process_started", "started"),
            ("forked", "forked"),
            ("registered", "registered"),
            ("torch_import_s", "torch import"),
            ("answered", "torch ready"),
            ("joined", "joined group"),
        ]
        if self.engines:
            lines.append("  engine  " + "  ".join(f"{title:>12}" for _, title in columns))
            for eid in sorted(self.engines):
                row = self.engines[eid]
                cells = [f"{row[key]:12.2f}" if key in row else f"{'-':>12}" for key, _ in columns]
                lines.append(f"  {eid:<6}  " + "  ".join(cells))
        lines.extend(f"  {remark}" for remark in self.remarks)
        with contextlib.suppress(OSError):  # no load average on this platform
            lines.append(f"  load average (1 min): {os.getloadavg()[0]:.1f}")
        return "\n".join(lines)
