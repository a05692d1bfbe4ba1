"""Who is where, and why a cell hangs: stacks on demand and the autopsy of a timeout.

``stacks`` asks the engines' control threads (``engine/autopsy.py``) for every thread's
Python stack while their main threads run (or are blocked): one control request per rank,
through the channel the cluster already has to every engine, on this host or another.

``take`` runs when a call's timeout expires, before the ranks are interrupted: it asks every
rank for its stack, its ledger of collectives (per cell) and torch's flight recorder, keeps
each rank's flight-recorder dump in the run directory (where
``python -m torch.distributed.flight_recorder.fr_trace`` reads it) and judges the case:

- "rank 1 never reached all_reduce #1: it is in load_batch (cell line 4)";
- "mismatch at collective #1: rank 0 all_reduce, rank 1 broadcast";
- "rank 1 issued 9 all_reduce, rank 0 waits in its 10th";
- "sizes differ at all_reduce #1: 16 B on rank 0, 32 B on rank 1".

``explain_death`` says the same of a collective whose sizes differ, which gloo does not hang
on but aborts the engine of the rank that reads too much: the ranks' ledgers (written before
each collective, so the dead rank's survives it) name both sizes.
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import enum
import html
import os
import pickle
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from workbench.cluster.dispatch import hang
from workbench.cluster.ranks import RankAssignment
from workbench.engine import hang as engine_hang
from workbench.engine.autopsy import REQUEST
from workbench.engine.hang import LedgerState

__all__ = [
    "ASK_S",
    "Autopsy",
    "RankAutopsy",
    "RankState",
    "ask",
    "explain_death",
    "judge",
    "read_ledger",
    "stacks_text",
    "take",
]

# How long the autopsy waits for the engines' answers (the control round trip is a few
# ms; a rank that does not answer in time is described from its ledger file).
ASK_S = 0.5
# ``cluster.stacks()``: a busy engine answers within milliseconds; one that does not in
# this long is said not to answer.
STACKS_S = 3.0
FR_DIR = "flight-recorder"  # in the run directory: one dump per rank, fr_trace's input


class RankState(enum.Enum):
    """Where a rank was when the timeout expired."""

    WAITING = "waits in a collective"
    BUSY = "busy"
    FINISHED = "finished the cell"
    DEAD = "dead"
    SILENT = "did not answer"


@dataclass(frozen=True, kw_only=True)
class RankAutopsy:
    """One rank: where it is, its stack, the collective it is in and what it issued."""

    rank: int
    state: RankState
    where: str = "?"  # file:line in function, or "cell line N, in function"
    stack: str = ""
    collective: dict[str, Any] | None = None  # op, nth, position, bytes (+ FR: sizes...)
    issued: dict[str, int] = field(default_factory=dict)  # op -> count, this cell

    def issued_text(self) -> str:
        if not self.issued:
            return "issued no collective"
        return "issued " + ", ".join(f"{n} {op}" for op, n in sorted(self.issued.items()))

    def collective_text(self) -> str:
        c = self.collective or {}
        details = [f"{c.get('bytes', '?')} B"]
        if c.get("dtype"):
            details.insert(0, f"{c['dtype']} {c.get('sizes', '')}".strip())
        if c.get("group") is not None:
            details.append(f"group {c['group']}")
        if c.get("seq") is not None:
            details.append(f"group seq {c['seq']}")
        return f"{c.get('op', '?')} #{c.get('nth', '?')} ({', '.join(details)})"

    def line(self) -> str:
        if self.state is RankState.WAITING:
            doing = f"waits in {self.collective_text()}"
        else:
            doing = self.state.value
        return f"rank {self.rank}: {doing} at {self.where}; {self.issued_text()}"


@dataclass(frozen=True, kw_only=True)
class Autopsy:
    """The autopsy of a timeout: ``verdict``, ``culprits`` and each rank's ``RankAutopsy``."""

    verdict: str
    culprits: list[int]
    ranks: dict[int, RankAutopsy]
    fr_dir: str | None = None  # where each rank's flight-recorder dump was kept
    seconds: float = 0.0  # what taking it cost

    def lines(self) -> list[str]:
        return [self.ranks[r].line() for r in sorted(self.ranks)]

    def message(self, hang_text: str) -> str:
        """The timeout's message: its first line, the verdict, then the hang report's line
        of each rank with where the autopsy found it (one line per rank) and the rest."""
        first, *rest = hang_text.split("\n")
        out = [first, f"autopsy: {self.verdict}"]
        for line in rest:
            rank = _rank_of(line)
            if rank in self.ranks:
                a = self.ranks[rank]
                detail = a.collective_text() + "; " if a.state is RankState.WAITING else ""
                line = f"{line} | {detail}at {a.where}; {a.issued_text()}"
            out.append(line)
        if self.fr_dir is not None:
            out.append(f"flight-recorder dumps: {self.fr_dir} (fr_trace reads them)")
        return "\n".join(out)

    def __str__(self) -> str:
        return "\n".join([f"autopsy: {self.verdict}", *(f"  {line}" for line in self.lines())])

    def _repr_html_(self) -> str:
        rows = "".join(
            "<tr>"
            + "".join(
                f"<td style='text-align:left'>{html.escape(str(v))}</td>"
                for v in (
                    a.rank,
                    a.state.value,
                    a.collective_text() if a.collective else "-",
                    a.where,
                    a.issued_text(),
                )
            )
            + f"<td style='text-align:left'><pre>{html.escape(a.stack)}</pre></td></tr>"
            for a in (self.ranks[r] for r in sorted(self.ranks))
        )
        head = "".join(
            f"<th>{h}</th>" for h in ("rank", "state", "collective", "where", "issued", "stack")
        )
        return (
            f"<p><b>{html.escape(self.verdict)}</b> (culprits: {self.culprits})</p>"
            f"<table><thead><tr>{head}</tr></thead><tbody>{rows}</tbody></table>"
        )


# ------------------------------------------------------------------------------ asking
def ask(
    client: Any, targets: Sequence[RankAssignment], *, fr: bool, timeout: float
) -> dict[int, dict[str, Any]]:
    """Each target rank's answer (``engine/autopsy.answer``); ranks that did not answer in
    ``timeout`` seconds (or answered an error) are left out."""
    futures: dict[Any, int] = {}
    for r in targets:
        try:
            future = client._send_control_request(
                targets=[r.engine_id], msg_type=REQUEST, content={"fr": fr}, block=False
            )
        except Exception:  # the engine left the controller: no answer
            continue
        futures[future] = r.rank
    done, _ = concurrent.futures.wait(list(futures), timeout=timeout)
    answers: dict[int, dict[str, Any]] = {}
    for future in done:
        try:
            replies = future.result(0)
        except Exception:
            continue
        for msg in replies or []:
            content = msg.get("content", {}) if isinstance(msg, dict) else {}
            if content.get("status") == "ok":
                answers[futures[future]] = content
    return answers


def stacks_text(answer: Mapping[str, Any]) -> str:
    """The main thread's stack, then the other threads folded to one line each."""
    main = list(answer.get("main") or [])
    threads = list(answer.get("threads") or [])
    lines = ["main thread (innermost last):", *(f"  {line}" for line in main)]
    if threads:
        lines.append(f"{len(threads)} other threads:")
        lines += [f"  {line}" for line in threads]
    return "\n".join(lines)


def stacks(client: Any, targets: Sequence[RankAssignment]) -> dict[int, str]:
    """Rank -> its stack text (``Cluster.stacks``); a rank that does not answer says so."""
    answers = ask(client, targets, fr=False, timeout=STACKS_S)
    return {
        r.rank: stacks_text(answers[r.rank])
        if r.rank in answers
        else f"rank {r.rank} (engine {r.engine_id} on {r.host}) did not answer within "
        f"{STACKS_S:g} s: its engine may be frozen or gone (cluster.status())"
        for r in targets
    }


def read_ledger(run_dir: str | os.PathLike[str] | None, rank: int) -> dict[str, Any] | None:
    """A rank's ledger file (on this host), or None."""
    return None if run_dir is None else engine_hang.read_ledger(run_dir, rank)


# ----------------------------------------------------------------------------- judging
def _ordinal(n: object) -> str:
    if not isinstance(n, int):
        return f"#{n}"
    suffix = "th" if 10 <= n % 100 <= 20 else {1: "st", 2: "nd", 3: "rd"}.get(n % 10, "th")
    return f"{n}{suffix}"


def _waiting_verdict(
    waiting: dict[int, RankAutopsy], others: list[RankAutopsy]
) -> tuple[str, list[int]] | None:
    """Ranks in collectives that disagree: op, position or size."""
    first = waiting[min(waiting)]
    c0 = first.collective or {}
    ops = {r: (a.collective or {}).get("op") for r, a in waiting.items()}
    positions = {r: (a.collective or {}).get("position") for r, a in waiting.items()}
    if len(set(ops.values())) > 1:
        where = f"collective #{c0.get('position', '?')}"
        if len(set(positions.values())) > 1:
            where = "the same point"
        listed = ", ".join(f"rank {r} {ops[r]}" for r in sorted(ops))
        return f"mismatch at {where}: {listed}", [r for r in sorted(ops) if ops[r] != c0.get("op")]
    if len(set(positions.values())) > 1:
        listed = ", ".join(f"rank {r} in its {_ordinal(positions[r] or 0)}" for r in sorted(ops))
        low = min(p or 0 for p in positions.values())
        return (
            f"ranks wait in different {c0.get('op')} collectives: {listed}",
            [r for r in sorted(ops) if positions[r] == low],
        )
    sizes = {r: (a.collective or {}).get("bytes") for r, a in waiting.items()}
    if len(set(sizes.values())) > 1:
        listed = ", ".join(f"{sizes[r]} B on rank {r}" for r in sorted(sizes))
        culprits = [r for r in sorted(sizes) if sizes[r] != c0.get("bytes")]
        return f"sizes differ at {c0.get('op')} #{c0.get('nth', '?')}: {listed}", culprits
    return None


def judge(ranks: Mapping[int, RankAutopsy]) -> tuple[str, list[int]]:
    """The verdict and the culprits (the ranks to look at) of an autopsy."""
    waiting = {r: a for r, a in ranks.items() if a.state is RankState.WAITING}
    others = [a for r, a in sorted(ranks.items()) if r not in waiting]
    if not waiting:
        busy = [a for a in others if a.state is RankState.BUSY]
        if busy:
            where = "; ".join(f"rank {a.rank} at {a.where}" for a in busy)
            return f"no rank is in a collective: busy in Python code ({where})", [
                a.rank for a in busy
            ]
        return "no rank is in a collective", [a.rank for a in others]
    disagree = _waiting_verdict(waiting, others)
    if disagree is not None:
        return disagree
    first = waiting[min(waiting)]
    c = first.collective or {}
    op, nth = c.get("op", "?"), c.get("nth") or "?"
    waiters = ", ".join(f"rank {r}" for r in sorted(waiting))
    parts = []
    for a in others:
        if a.state is RankState.BUSY:
            parts.append(f"rank {a.rank} never reached {op} #{nth}: it is in {_in(a.where)}")
        elif a.state is RankState.FINISHED:
            parts.append(
                f"rank {a.rank} issued {a.issued.get(op, 0)} {op}, {waiters} "
                f"{'waits' if len(waiting) == 1 else 'wait'} in {_its(waiting)} {_ordinal(nth)}"
            )
        elif a.state is RankState.DEAD:
            parts.append(f"rank {a.rank} died before {op} #{nth}")
        else:
            parts.append(f"rank {a.rank} did not answer ({op} #{nth} waits for it)")
    return "; ".join(parts), [a.rank for a in others]


def _its(waiting: Mapping[int, Any]) -> str:
    return "its" if len(waiting) == 1 else "their"


def _in(where: str) -> str:
    """``load_batch (cell line 4)`` from ``cell line 4, in load_batch``."""
    if where.startswith("cell line ") and ", in " in where:
        line, function = where.split(", in ", 1)
        return f"{function} ({line})"
    return where


# ------------------------------------------------------------------------------ taking
def _current_group(fr: Mapping[str, Any] | None) -> list[dict[str, Any]]:
    """The flight recorder's entries of the process group that exists now: a recovery makes
    a new one whose sequence numbers start again at 1 (the older entries stay in the ring)."""
    entries = [e for e in (fr or {}).get("entries") or [] if isinstance(e, dict)]
    start = 0
    for i in range(1, len(entries)):
        if int(entries[i].get("collective_seq_id") or 0) <= int(
            entries[i - 1].get("collective_seq_id") or 0
        ):
            start = i
    return entries[start:]


def _op(entry: Mapping[str, Any]) -> str:
    return str(entry.get("profiling_name", "")).split(":")[-1]  # "gloo:all_reduce"


def _details(entry: Mapping[str, Any]) -> dict[str, Any]:
    pg = entry.get("process_group") or []
    return {
        "sizes": entry.get("input_sizes"),
        "dtype": ",".join(entry.get("input_dtypes") or []),
        "group": pg[1] if len(pg) > 1 and pg[1] else (pg[0] if pg else None),
        "seq": entry.get("collective_seq_id"),
    }


def _collective(
    ledger: Mapping[str, Any] | None,
    fr: Mapping[str, Any] | None,
    status: Mapping[str, Any] | None,
) -> dict[str, Any] | None:
    """The collective a rank is in: the ledger's last one while it is "in" (a cell's: its
    numbers count this cell), else the status file's in-flight one (a training run's:
    numbered by the flight recorder, since the group was made); with the flight recorder's
    details of its latest entry of that op (sizes, dtype, group, sequence number)."""
    entries = _current_group(fr)
    if ledger and ledger.get("state") == LedgerState.IN.value:
        last = dict(ledger.get("last") or {})
        collective = {
            "op": last.get("op", "?"),
            "nth": last.get("nth"),
            "position": last.get("in_cell"),
            "bytes": last.get("bytes"),
        }
    else:
        flights = (status or {}).get("in_flight") or []
        if not flights:
            return None
        flight = flights[0]
        same = [e for e in entries if _op(e) == flight.get("op")]
        seq = same[-1].get("collective_seq_id") if same else None
        began = dict((ledger or {}).get("last") or {})  # a file's: the last one begun
        counted = began.get("op") == flight.get("op")
        collective = {
            "op": flight.get("op", "?"),
            "nth": began.get("nth") if counted else len(same) or "?",
            "position": began.get("in_cell") if counted else seq,
            "bytes": flight.get("bytes"),
            "step": flight.get("step"),
            "phase": flight.get("phase"),
        }
    if entries and _op(entries[-1]) == collective["op"]:
        collective.update(_details(entries[-1]))
    return collective


def _issued(ledger: Mapping[str, Any] | None, fr: Mapping[str, Any] | None) -> dict[str, int]:
    """Collectives issued, by op: this cell's (the ledger), or, while the cell tracer is
    off (a training run records its own), the current group's in the flight recorder."""
    if ledger and ledger.get("state") != LedgerState.UNTRACKED.value:
        return dict(ledger.get("counts") or {})
    counts: dict[str, int] = {}
    for entry in _current_group(fr):
        counts[_op(entry)] = counts.get(_op(entry), 0) + 1
    return counts


def _named_groups(fr: Mapping[str, Any], world_size: int) -> dict[str, Any]:
    """The dump with a ``pg_config`` row for each group its entries name: gloo's JSON dump
    lists the default group under an empty name, and ``fr_trace`` looks groups up by the
    name the entries carry (its ranks: the listed ones, else the whole world)."""
    dump = dict(fr)
    config = dict(dump.get("pg_config") or {})
    known = next(iter(config.values()), {}) if config else {}
    ranks = known.get("ranks") if isinstance(known, dict) else None
    for entry in dump.get("entries") or []:
        pg = entry.get("process_group") or []
        if pg and pg[0] not in config:
            desc = pg[1] if len(pg) > 1 else ""
            config[pg[0]] = {
                "name": pg[0],
                "desc": desc,
                "ranks": ranks or str(list(range(world_size))),
            }
    dump["pg_config"] = config
    return dump


def _keep_dump(fr_dir: Path, rank: int, fr: Mapping[str, Any], world_size: int) -> None:
    """``fr_dir/rank_<r>``, the pickle ``fr_trace`` reads, made here from the JSON the
    engine sent (nothing is unpickled here); 0700 / 0600 like every file a run leaves."""
    fr_dir.mkdir(mode=0o700, parents=True, exist_ok=True)
    path = fr_dir / f"rank_{rank}"
    data = pickle.dumps(_named_groups(fr, world_size))
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "wb") as out:
        out.write(data)


def take(
    client: Any,
    targets: Sequence[RankAssignment],
    pending: Sequence[int],
    run_dir: str | None,
    dead: Sequence[int] = (),
    timeout: float = ASK_S,
    world_size: int | None = None,
) -> Autopsy:
    """The autopsy of ``targets`` whose ``pending`` ranks did not finish in time (of a
    world of ``world_size`` ranks: default, the targets are all)."""
    world = len(targets) if world_size is None else world_size
    started = time.monotonic()
    answers = ask(client, [t for t in targets if t.rank not in dead], fr=True, timeout=timeout)
    fr_dir = Path(run_dir) / FR_DIR if run_dir is not None else None
    ranks: dict[int, RankAutopsy] = {}
    for t in targets:
        answer = answers.get(t.rank)
        # (a rank that did not answer: its status file says whether it waits, its ledger
        # file only which collective it began last: "in" there is not trusted)
        ledger = (answer or {}).get("ledger")
        if answer is None and (began := read_ledger(run_dir, t.rank)) is not None:
            ledger = {**began, "state": LedgerState.UNTRACKED.value}
        fr = (answer or {}).get("fr")
        if fr and fr_dir is not None:
            with contextlib.suppress(OSError):  # a full run dir must not hide the verdict
                _keep_dump(fr_dir, t.rank, fr, world)
        status = hang.read_status(run_dir, t.rank) if t.rank in pending else None
        collective = _collective(ledger, fr, status) if t.rank in pending else None
        if t.rank in dead:
            state = RankState.DEAD
        elif t.rank not in pending:
            state = RankState.FINISHED
        elif collective is not None:
            state = RankState.WAITING
        elif answer is None:
            state = RankState.SILENT
        else:
            state = RankState.BUSY
        where = str((answer or {}).get("where") or "?")
        ranks[t.rank] = RankAutopsy(
            rank=t.rank,
            state=state,
            where="idle" if state is RankState.FINISHED else where,
            stack=stacks_text(answer) if answer else "",
            collective=collective,
            issued=_issued(ledger, fr),
        )
    verdict, culprits = judge(ranks)
    return Autopsy(
        verdict=verdict,
        culprits=culprits,
        ranks=ranks,
        fr_dir=str(fr_dir) if fr_dir is not None and answers else None,
        seconds=time.monotonic() - started,
    )


def explain_death(run_dir: str | None, size: int, lost: Sequence[int]) -> str | None:
    """Why ``lost`` ranks' engines died, when their ledgers say it was a collective the
    ranks did not agree on (gloo aborts the engine that receives more than it expects):
    "sizes differ at all_reduce #1: 16 B on rank 0, 32 B on rank 1"; else None."""
    ledgers = {r: read_ledger(run_dir, r) for r in range(size)}
    lasts = {r: (led or {}).get("last") or {} for r, led in ledgers.items()}
    at = {r: last.get("issued") for r, last in lasts.items()}
    dying = [r for r in lost if (ledgers[r] or {}).get("state") == LedgerState.IN.value]
    if not dying or None in at.values() or len(set(at.values())) != 1:
        return None  # not every rank's latest collective is the same one
    ops = {r: lasts[r].get("op") for r in lasts}
    if len(set(ops.values())) > 1:
        listed = ", ".join(f"rank {r} {ops[r]}" for r in sorted(ops))
        position = lasts[dying[0]].get("in_cell", "?")
        return f"mismatch at collective #{position}: {listed}"
    sizes = {r: lasts[r].get("bytes") for r in lasts}
    if len(set(sizes.values())) > 1:
        listed = ", ".join(f"{sizes[r]} B on rank {r}" for r in sorted(sizes))
        op = lasts[dying[0]].get("op")
        return f"sizes differ at {op} #{lasts[dying[0]].get('nth', '?')}: {listed}"
    return None


def _rank_of(line: str) -> int | None:
    """N of a hang report's ``  rank N: ...`` line."""
    head = line.strip()
    if not head.startswith("rank ") or ":" not in head:
        return None
    number = head[len("rank ") : head.index(":")]
    return int(number) if number.isdigit() else None
