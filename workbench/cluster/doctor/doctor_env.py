"""The cluster doctor's environment check: every engine's facts side by side, one row per
host, and the differences that break a run refused before the process group forms.

Engines report their facts with their start-up facts (``engine/doctor_env.py``). A
difference in torch, CUDA, NCCL, the workbench, Python's minor version or a package the
user named (``check_packages=``) makes ranks disagree on what a collective or a pickled
object is, so the start fails naming the hosts and both versions; any other difference is
a warning.
"""

from __future__ import annotations

import html
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from workbench.errors import ClusterError
from workbench.validate import invalid

__all__ = [
    "EnvironmentReport",
    "check_package_names",
    "compare_new_engines",
    "environment_report",
    "flatten",
]

# Fields whose difference breaks correctness (besides the user's own packages).
BREAKING = ("python minor", "torch", "torch git", "cuda", "nccl", "workbench")
# Fields shown but never warned about: hosts legitimately differ in them.
INFORMATIONAL = ("cpus", "gpus")
_PACKAGE_NAME = re.compile(r"^[A-Za-z0-9]([A-Za-z0-9._-]*[A-Za-z0-9])?$")


def check_package_names(name: str, packages: object) -> tuple[str, ...]:
    """``check_packages`` as a tuple of distribution names, or the standard error."""
    if isinstance(packages, str):
        packages = [p for p in packages.split(",") if p.strip()]
    if not isinstance(packages, Sequence | set | frozenset):
        raise invalid(name, packages, "it is not a list of package names", "e.g. ['peft']")
    names = tuple(str(p).strip() if isinstance(p, str) else p for p in packages)
    for p in names:
        if not isinstance(p, str) or not _PACKAGE_NAME.match(p):
            raise invalid(
                name,
                p,
                "it is not a package name",
                "names as pip spells them (letters, digits, '.', '-', '_'), e.g. ['peft']",
            )
    return names


def _gpus_text(gpus: Sequence[Mapping[str, Any]]) -> str:
    if not gpus:
        return "none"
    kinds: dict[str, int] = {}
    for g in gpus:
        key = f"{g['name']} {int(g['memory']) / 2**30:.0f} GiB, driver {g['driver']}"
        kinds[key] = kinds.get(key, 0) + 1
    return "; ".join(f"{n}x {k}" for k, n in kinds.items())


def flatten(facts: Mapping[str, Any]) -> dict[str, str]:
    """One engine's facts as named strings, in display order."""
    python = str(facts.get("python", "?"))
    flat = {
        "python": python,
        "python minor": ".".join(python.split(".")[:2]),
        "torch": str(facts.get("torch")),
        "torch git": str(facts.get("torch_git")),
        "cuda": str(facts.get("cuda")),
        "cudnn": str(facts.get("cudnn")),
        "nccl": str(facts.get("nccl")),
    }
    for name, version in facts.get("packages", {}).items():
        flat[name] = str(version) if version is not None else "missing"
    flat["gpus"] = _gpus_text(facts.get("gpus", []))
    flat["cpus"] = str(facts.get("cpus"))
    for name, value in facts.get("env", {}).items():
        flat[f"${name}"] = value
    return flat


@dataclass(slots=True)
class EnvironmentReport:
    """Rows (one per host, or per engine where a host's engines differ) and what differs.

    ``errors`` are differences that break a run, ``warnings`` the others; each names the
    field and every row's value."""

    rows: dict[str, dict[str, str]]
    errors: list[str] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)
    # what was compared: (host, engine id, facts) per engine; engines started later (a
    # recovery's replacements, a grow) are compared against these
    engines: list[tuple[str, int, Mapping[str, Any]]] = field(default_factory=list)

    @property
    def columns(self) -> list[str]:
        names: dict[str, None] = {}
        for flat in self.rows.values():
            names.update(dict.fromkeys(flat))
        return list(names)

    def differences(self) -> dict[str, dict[str, str]]:
        """field -> {row: value} for every field whose value is not the same on every row."""
        out: dict[str, dict[str, str]] = {}
        for name in self.columns:
            values = {row: flat.get(name, "unset") for row, flat in self.rows.items()}
            if len(set(values.values())) > 1:
                out[name] = values
        return out

    def __repr__(self) -> str:
        head = f"{len(self.rows)} host(s), {len(self.differences())} field(s) differ"
        lines = [f"<EnvironmentReport {head}>"]
        lines += [f"  error: {e}" for e in self.errors]
        lines += [f"  warning: {w}" for w in self.warnings]
        return "\n".join(lines)

    def _repr_html_(self) -> str:
        """One row per field, one column per host: a few hosts fit a 1,280 px screen, where
        16 fields side by side (a 40-character torch git hash among them) ran off it."""
        differ = self.differences()
        hosts = "".join(f"<th>{html.escape(row)}</th>" for row in self.rows)
        body = []
        for c in self.columns:
            style = ' style="background:#fdd"' if c in differ else ""
            tds = "".join(
                _cell(flat.get(c, "unset"), style, c in _SHORTENED) for flat in self.rows.values()
            )
            body.append(f"<tr><th style='text-align:left'>{html.escape(c)}</th>{tds}</tr>")
        notes = "".join(f"<li>{html.escape(t)}</li>" for t in self.errors + self.warnings)
        return f"<table><tr><th>field</th>{hosts}</tr>{''.join(body)}</table>" + (
            f"<ul>{notes}</ul>" if notes else "<p>same environment on every host</p>"
        )


# Shown to 12 characters (the whole value in the cell's tooltip), as git abbreviates.
_SHORTENED = frozenset({"torch git"})


def _cell(value: str, style: str, shorten: bool) -> str:
    text = value[:12] + "…" if shorten and len(value) > 13 else value
    title = f' title="{html.escape(value)}"' if text != value else ""
    return f"<td{style}{title}>{html.escape(text)}</td>"


def _rows(labelled: Sequence[tuple[str, int, Mapping[str, Any]]]) -> dict[str, dict[str, str]]:
    """(host, engine id, facts) -> one row per host, or per engine where a host's differ."""
    by_host: dict[str, list[tuple[int, dict[str, str]]]] = {}
    for host, eid, facts in labelled:
        by_host.setdefault(host, []).append((eid, flatten(facts)))
    rows: dict[str, dict[str, str]] = {}
    for host, engines in by_host.items():
        if all(flat == engines[0][1] for _, flat in engines):
            rows[host] = engines[0][1]
        else:
            rows.update({f"{host} (engine {eid})": flat for eid, flat in engines})
    return rows


def environment_report(
    labelled: Sequence[tuple[str, int, Mapping[str, Any]]], check_packages: Sequence[str] = ()
) -> EnvironmentReport:
    """Compare engines' facts: (host, engine id, ``environment_facts()``) for each."""
    report = EnvironmentReport(rows=_rows(labelled), engines=list(labelled))
    breaking = set(BREAKING) | set(check_packages)
    differ = report.differences()
    for name, values in differ.items():
        if name in INFORMATIONAL:
            continue
        if name == "python":  # a minor version's difference is the error below
            if "python minor" not in differ:
                report.warnings.append(f"python differs in its patch version: {_each(values)}")
            continue
        (report.errors if name in breaking else report.warnings).append(
            f"{name} differs: {_each(values)}"
        )
    return report


def _each(values: Mapping[str, str]) -> str:
    return ", ".join(f"{row} has {value}" for row, value in values.items())


def refuse_mismatch(report: EnvironmentReport) -> None:
    """Raise the start's error when the engines' environments break a run."""
    if report.errors:
        raise ClusterError(
            "the engines' environments differ where a run needs them equal:\n  "
            + "\n  ".join(report.errors)
            + "\ninstall the same versions on every host (see cluster.doctor('env'))"
        )


def compare_new_engines(
    before: EnvironmentReport | None,
    new: Sequence[tuple[int, Mapping[str, Any]]],
    check_packages: Sequence[str] = (),
) -> EnvironmentReport:
    """Engines started after the start (``(engine id, timed_engine_info())`` each) checked
    as the start checks its engines, against the engines it compared (``before``): a
    replacement with another torch or package version fails with the start's message."""
    labelled = [(str(i["host"]), eid, i.get("environment", {})) for eid, i in new]
    report = environment_report([*(before.engines if before else []), *labelled], check_packages)
    refuse_mismatch(report)
    return report
