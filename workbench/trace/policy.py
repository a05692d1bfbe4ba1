"""Which steps keep their full detail: the recording policy behind ``record=``.

Modelled on ``torch.profiler.schedule(wait, warmup, active, repeat, skip_first)``. Per-step
summaries (loss, step time, peak bytes per memory category, bytes and seconds per
collective op) are kept for every step whatever the policy; the policy only chooses the
steps whose every phase span, collective and memory sample is kept as well:

- the first ``first`` steps (what the run looked like when it started),
- the steps a schedule selects: skip ``skip_first`` steps, then cycles of ``wait`` steps
  left out, ``warmup`` steps left out (the tracers run, as torch.profiler's warm-up does,
  but nothing is kept), ``active`` steps kept; ``repeat`` cycles (0: until the run ends),
- a window of the ``recent`` last steps, which moves with the run: a step that leaves it
  and is not selected otherwise keeps its summary only.

A window larger than the run keeps the whole run (that is its meaning, not an error). A
policy that would keep no step at all in detail is refused: use summaries' figures then.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from workbench import validate

__all__ = ["DEFAULT_POLICY", "RECORD_CHOICES", "RecordPolicy", "record_policy", "schedule"]

# The strings ``record=`` takes besides a ``RecordPolicy``.
RECORD_CHOICES = ("default", "all")


@dataclass(frozen=True, slots=True, kw_only=True)
class RecordPolicy:
    """Steps kept in full detail (see the module doc); build it with ``schedule()``."""

    first: int = 10
    recent: int = 50
    wait: int = 0
    warmup: int = 0
    active: int = 0
    repeat: int = 0
    skip_first: int = 0
    keep_all: bool = False  # record="all": every step in detail (to the run directory)

    def __post_init__(self) -> None:
        for name in ("first", "recent", "wait", "warmup", "active", "repeat", "skip_first"):
            validate.integer(name, getattr(self, name), minimum=0, what="a number of steps")
        if self.active == 0 and (self.wait or self.warmup or self.repeat):
            raise validate.invalid(
                "active",
                self.active,
                "a schedule with wait/warmup/repeat but no active step records nothing",
                "use active >= 1",
            )
        if not self.keep_all and self.first == 0 and self.recent == 0 and self.active == 0:
            raise validate.invalid(
                "record",
                self,
                "it keeps no step in detail (first=0, recent=0 and no active steps)",
                "keep some: first >= 1, recent >= 1 or a schedule with active >= 1 "
                "(summaries are kept for every step anyway)",
            )

    def selected(self, step: int) -> bool:
        """Whether ``step`` keeps its detail for good (first steps or the schedule); the
        recent window is the store's, since it moves."""
        if self.keep_all or step < self.first:
            return True
        if self.active == 0 or step < self.skip_first:
            return False
        cycle = self.wait + self.warmup + self.active
        index = step - self.skip_first
        if self.repeat and index // cycle >= self.repeat:
            return False
        return index % cycle >= self.wait + self.warmup

    def describe(self) -> str:
        if self.keep_all:
            return "every step in detail"
        parts = []
        if self.first:
            parts.append(f"the first {self.first} steps")
        if self.active:
            cycles = f"{self.repeat} times" if self.repeat else "to the end"
            parts.append(
                f"{self.active} of every {self.wait + self.warmup + self.active} steps "
                f"after {self.skip_first} ({cycles})"
            )
        if self.recent:
            parts.append(f"the last {self.recent} steps")
        return "detail for " + ", ".join(parts) + "; summaries for every step"


DEFAULT_POLICY = RecordPolicy()


def schedule(
    *,
    wait: int = 0,
    warmup: int = 0,
    active: int = 1,
    repeat: int = 0,
    skip_first: int = 0,
    first: int = 0,
    recent: int = 0,
) -> RecordPolicy:
    """A profiler-style schedule (``torch.profiler.schedule``'s arguments), optionally with
    the first steps and a recent window as well: ``record=wb.trace.schedule(wait=98,
    warmup=1, active=1)`` keeps one step in a hundred in full detail."""
    return RecordPolicy(
        first=first,
        recent=recent,
        wait=wait,
        warmup=warmup,
        active=active,
        repeat=repeat,
        skip_first=skip_first,
    )


def record_policy(value: Any) -> RecordPolicy:
    """``record=`` as given (None, "default", "all" or a ``RecordPolicy``), checked."""
    if value is None or value == "default":
        return DEFAULT_POLICY
    if isinstance(value, RecordPolicy):
        return value
    if value == "all":
        return RecordPolicy(keep_all=True)
    raise validate.invalid(
        "record",
        value,
        "not a recording policy",
        f"choose one of {list(RECORD_CHOICES)}, None (the default), or "
        "workbench.trace.schedule(wait=, warmup=, active=, repeat=, first=, recent=)",
    )


def parse_record(text: str) -> RecordPolicy:
    """``%wb run --record`` text: ``default``, ``all`` or ``key=value,...`` of
    ``schedule()``'s arguments (``wait=9,active=1,first=5``). Never evaluated."""
    text = text.strip()
    if text in RECORD_CHOICES:
        return record_policy(text)
    fields: dict[str, int] = {}
    names = ("wait", "warmup", "active", "repeat", "skip_first", "first", "recent")
    for part in filter(None, (p.strip() for p in text.split(","))):
        key, sep, raw = part.partition("=")
        key = key.strip()
        if not sep or key not in names:
            raise validate.invalid(
                "--record",
                text,
                f"{part!r} is not a setting",
                f"use {list(RECORD_CHOICES)} or key=value pairs of {list(names)}",
            )
        try:
            fields[key] = int(raw)
        except ValueError:
            raise validate.invalid(
                "--record", text, f"{key}={raw!r} is not an integer", "use whole steps"
            ) from None
    if not fields:
        raise validate.invalid("--record", text, "empty", f"use {list(RECORD_CHOICES)}")
    if "active" not in fields and any(fields.get(k) for k in ("wait", "warmup", "repeat")):
        fields["active"] = 0  # refused below, with the reason
    if "active" in fields:
        return schedule(**fields)
    return RecordPolicy(**fields)
