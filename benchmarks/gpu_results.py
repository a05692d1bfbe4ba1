"""The ``make gpu-check`` result file: the machine (device, driver, CUDA, NCCL, torch) and
each check's outcome and numbers, as JSON and as a short markdown table.

``tests/gpu/conftest.py`` collects the checks while pytest runs and calls ``write_results``
at the end when ``WB_GPU_RESULTS`` names a directory (``tools/gpu_check.sh`` sets
``benchmarks/results/gpu``). Without a CUDA device the file says so, and every check is
listed as skipped with its reason: a dry run leaves the same file a device run does.
"""

from __future__ import annotations

import json
import os
import platform
import shutil
import subprocess
import tempfile
import time
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

__all__ = ["NO_DEVICE", "environment", "nvidia_smi", "render_markdown", "write_results"]

NO_DEVICE = "no CUDA device"
OUTCOMES = ("passed", "failed", "skipped", "error")


def nvidia_smi(*args: str) -> str | None:
    """nvidia-smi's output for ``args``, or None where it is missing or fails."""
    exe = shutil.which("nvidia-smi")
    if exe is None:
        return None
    try:
        return subprocess.run(
            [exe, *args], capture_output=True, text=True, timeout=30, check=True
        ).stdout
    except (OSError, subprocess.SubprocessError):
        return None


def _nvidia_smi() -> dict[str, str]:
    """Name, driver and memory of GPU 0 as nvidia-smi reports them (empty without it)."""
    out = nvidia_smi("--query-gpu=name,driver_version,memory.total", "--format=csv,noheader")
    if out is None:
        return {}
    lines = out.strip().splitlines()
    if not lines:
        return {}
    name, driver, memory = (part.strip() for part in lines[0].split(",")[:3])
    return {"name": name, "driver": driver, "memory": memory, "count": str(len(lines))}


def environment() -> dict[str, Any]:
    """The machine the checks ran on. Asks torch whether CUDA works only after nvidia-smi
    found a GPU (so a CPU machine's dry run never loads the CUDA runtime)."""
    import torch

    smi = _nvidia_smi()
    env: dict[str, Any] = {
        "device": NO_DEVICE,
        "device_count": 0,
        "driver": smi.get("driver"),
        "torch": torch.__version__,
        "torch_cuda": torch.version.cuda,  # None: a CPU build of torch
        "nccl": None,
        "python": platform.python_version(),
        "host": platform.node(),
    }
    if smi and torch.cuda.is_available():
        nccl = torch.cuda.nccl.version()
        env.update(
            device=torch.cuda.get_device_name(0),
            device_count=torch.cuda.device_count(),
            memory=smi.get("memory"),
            nccl=".".join(str(v) for v in nccl) if isinstance(nccl, tuple) else str(nccl),
        )
    elif smi:
        env["device"] = f"{NO_DEVICE} usable by torch (nvidia-smi sees {smi['name']})"
    return env


def _number(value: Any) -> str:
    if isinstance(value, float):
        return f"{value:.4g}"
    return str(value)


def render_markdown(env: Mapping[str, Any], checks: Iterable[Mapping[str, Any]]) -> str:
    """The table: one row per check, its outcome and its numbers (or why it was skipped)."""
    rows = list(checks)
    counts = {o: sum(1 for c in rows if c["outcome"] == o) for o in OUTCOMES}
    lines = [
        "# make gpu-check",
        "",
        f"- device: {env['device']} (count {env.get('device_count', 0)})",
        f"- driver: {env.get('driver')}, CUDA (torch build): {env.get('torch_cuda')}, "
        f"NCCL: {env.get('nccl')}",
        f"- torch {env.get('torch')}, Python {env.get('python')}, when {env.get('when')}",
        "- " + ", ".join(f"{counts[o]} {o}" for o in OUTCOMES if counts[o] or o == "passed"),
        "",
        "| check | outcome | numbers or reason |",
        "|---|---|---|",
    ]
    for c in rows:
        numbers = c.get("numbers") or {}
        shown = "; ".join(f"{k}={_number(v)}" for k, v in numbers.items())
        detail = shown if shown else c.get("reason", "")
        if shown and c.get("reason"):
            detail = f"{shown}; {c['reason']}"
        detail = detail.replace("|", "\\|").replace("\n", " ")
        lines.append(f"| `{c['name']}` | {c['outcome']} | {detail} |")
    return "\n".join(lines) + "\n"


def _write_atomically(path: Path, text: str) -> None:
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
    try:
        with os.fdopen(fd, "w") as f:
            f.write(text)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def write_results(
    out_dir: str | os.PathLike[str],
    env: Mapping[str, Any],
    checks: Iterable[Mapping[str, Any]],
    *,
    when: str | None = None,
) -> tuple[Path, Path]:
    """Write ``gpu-check.json`` and ``gpu-check.md`` under ``out_dir``; returns both paths.

    Each check is ``{"name", "outcome", "reason"?, "numbers"?, "seconds"?}`` with an
    outcome among ``OUTCOMES``. Each file is replaced whole (never left half-written)."""
    rows = [dict(c) for c in checks]
    for c in rows:
        if c.get("outcome") not in OUTCOMES:
            raise ValueError(
                f"check {c.get('name')!r} has outcome={c.get('outcome')!r}; "
                f"valid: {', '.join(OUTCOMES)}"
            )
    stamped = {**env, "when": when or time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    json_path, md_path = out / "gpu-check.json", out / "gpu-check.md"
    payload = {"environment": stamped, "checks": rows}
    _write_atomically(json_path, json.dumps(payload, indent=2, sort_keys=True) + "\n")
    _write_atomically(md_path, render_markdown(stamped, rows))
    return json_path, md_path
