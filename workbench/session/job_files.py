"""From the notebook to the batch job: the files ``workbench.export`` writes.

A run (a ``TrainingSession``'s ``RunSpec``, or a user run's ``UserSpec``) becomes
``run.json`` for ``python -m workbench.parallel.job`` (``parallel/job.py``); a script stays
the script. Either way the folder gets ``torchrun.sh`` (one node, the command line alone)
and ``job.sbatch`` (``srun`` starts one ``torchrun`` per node of the allocation; they meet
at the allocation's first node, read with ``scontrol show hostnames``; each node points gloo
at the interface it reaches the others through). Checkpoints go to
the notebook's directory, signed with the notebook's key file: the scripts point
``WORKBENCH_STATE_DIR`` at the folder that holds it and refuse to start without it (a job
with a fresh key would write checkpoints the notebook then refuses). The key itself is
never copied into the export.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import sys
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from workbench import validate
from workbench.errors import ConfigError
from workbench.parallel.job import JOB_FORMAT
from workbench.parallel.run_spec import RunSpec

__all__ = ["Export", "JobShape", "job_for_run", "json_option", "shell_word", "write_export"]

JOB_FILE = "run.json"
TORCHRUN_FILE = "torchrun.sh"
SBATCH_FILE = "job.sbatch"
DEFAULT_PORT = 29500


@dataclass(frozen=True, slots=True)
class JobShape:
    """Where the job runs: ``nodes`` x ``procs_per_node`` ranks, one GPU each when ``gpus``."""

    nodes: int = 1
    procs_per_node: int = 2
    gpus: bool = False

    def __post_init__(self) -> None:
        validate.integer("nodes", self.nodes, minimum=1, maximum=4096, what="a node count")
        validate.integer(
            "procs_per_node", self.procs_per_node, minimum=1, maximum=1024, what="a count"
        )
        validate.boolean("gpus", self.gpus)

    @property
    def world_size(self) -> int:
        return self.nodes * self.procs_per_node


@dataclass(frozen=True, slots=True)
class Export:
    """What ``write_export`` wrote: the folder, the single-node command line, the files."""

    directory: Path
    torchrun: list[str]
    files: dict[str, Path]

    @property
    def command(self) -> str:
        return shlex.join(self.torchrun)

    def __str__(self) -> str:
        lines = [f"exported to {self.directory}", f"  one node:  {self.command}"]
        lines += [f"  {kind + ':':<10} {path}" for kind, path in self.files.items()]
        return "\n".join(lines)


def _exportable(role: str, shipped: Any) -> str | None:
    if shipped is None:
        return None
    if shipped.import_path:
        return str(shipped.import_path)
    where = f"a name defined on the engines ({shipped.name!r})" if shipped.name else "notebook code"
    raise ConfigError(
        f"{role}={shipped.label} cannot be exported: it is {where}, and a batch job imports "
        "its factories by name. Move it into a module beside the notebook (e.g. models.py) "
        f"and pass it from there, or pass {role}='package.module:attr'"
    )


def json_option(name: str, value: Any) -> Any:
    """``value`` as the job file holds it (JSON: tuples become lists), or a ConfigError
    naming the option: a job file holds data, never objects (a module class, a callable)."""
    if value is None or isinstance(value, bool | int | float | str):
        return value
    if isinstance(value, list | tuple):
        return [json_option(name, v) for v in value]
    raise ConfigError(
        f"{name}={value!r} cannot be exported: a job file holds plain values, not "
        f"{type(value).__name__} objects; give it by name (e.g. a module name pattern)"
    )


def _user_job(spec: Any, world: int) -> dict[str, Any]:
    factories = {role: _exportable(role, s) for role, s in spec.factories.items()}
    payload = spec.payload(world)
    layout = dict(payload["layout"])
    plan = layout.get("tp_plan")
    if plan is not None and not all(isinstance(v, str) for v in plan.values()):
        raise ConfigError(
            "tp_plan cannot be exported with ParallelStyle objects; give it with names "
            "('colwise', 'rowwise') so the job file can hold it"
        )
    if layout.get("pp_split") is not None:
        layout["pp_split"] = list(layout["pp_split"])
    return {
        "kind": "user",
        "factories": factories,
        "layout": layout,
        "strategy": payload["strategy"],
        "options": {k: json_option(k, v) for k, v in payload["options"].items()},
    }


def job_for_run(spec: Any, world: int, steps: int) -> dict[str, Any]:
    """The job file's content for ``spec`` on ``world`` ranks, checked before writing."""
    validate.integer("steps", steps, minimum=1, maximum=10_000_000, what="a step count")
    if isinstance(spec, RunSpec):
        from workbench.session.run_state import validate_layout

        validate_layout(spec, world)
        body: dict[str, Any] = {"kind": "preset", "spec": asdict(spec)}
    else:
        spec.validate(world)
        body = _user_job(spec, world)
    return {"format": JOB_FORMAT, **body, "steps": steps}


def _module_root(module_name: str) -> Path | None:
    """The folder whose entry on ``sys.path`` makes ``module_name`` importable, found
    without importing anything: only its top-level package is located
    (``find_spec`` of a dotted name would import the parents, running their code)."""
    import importlib.util

    top = module_name.partition(".")[0]
    try:
        spec = importlib.util.find_spec(top)
    except (ImportError, ValueError):
        spec = None
    if spec is None:
        raise ConfigError(
            f"the job's factory module {module_name!r} is not importable here (no "
            f"{top!r} on sys.path); run the export where the notebook's modules are"
        )
    if spec.submodule_search_locations:  # a package (or a namespace package)
        location = Path(next(iter(spec.submodule_search_locations)))
    elif spec.origin and spec.has_location:
        location = Path(spec.origin)
    else:  # built in or frozen: nothing to put on the path
        return None
    return location.resolve().parent


def _module_roots(job: dict[str, Any]) -> list[str]:
    """The folders to put on ``PYTHONPATH`` so the job imports the user's modules."""
    roots: list[str] = []
    for name in (job.get("factories") or {}).values():
        if not name:
            continue
        root = _module_root(name.partition(":")[0])
        if root is None or "site-packages" in root.parts:
            continue
        if str(root) not in roots:
            roots.append(str(root))
    return roots


def _job_name(text: str) -> str:
    """``text`` as a Slurm job name that is one safe word: anything but letters, digits,
    ``.``, ``_`` and ``-`` (a newline would start a new line of the script) becomes
    ``_``."""
    return re.sub(r"[^A-Za-z0-9._-]", "_", text)[:100] or "workbench"


def _torchrun() -> str:
    """This environment's torchrun (the one next to its python), else the name alone."""
    local = Path(sys.executable).parent / "torchrun"
    return str(local) if local.exists() else "torchrun"


def torchrun_argv(target: list[str], procs: int, *, port: int = DEFAULT_PORT) -> list[str]:
    """One node: ``procs`` ranks meeting on 127.0.0.1 (nothing else is reachable there)."""
    return [
        _torchrun(),
        "--nnodes",
        "1",
        "--nproc-per-node",
        str(procs),
        "--master-addr",
        "127.0.0.1",
        "--master-port",
        str(port),
        *target,
    ]


def shell_word(text: str) -> str:
    """``text`` as one bash word on one line: ``shlex.quote``, or ANSI-C quoting
    (``$'...'``) where it holds a newline or another control character, so no path or
    argument (a file name may hold a newline) spans lines of a generated script."""
    if text.isprintable():
        return shlex.quote(text)
    escaped = []
    for c in text:
        if c in "\\'":
            escaped.append(f"\\{c}")
        elif c.isprintable():
            escaped.append(c)
        else:
            escaped.append(f"\\x{ord(c):02x}" if ord(c) < 256 else f"\\U{ord(c):08x}")
    return "$'" + "".join(escaped) + "'"


def _preamble(cwd: str, roots: list[str], key_dir: str | None) -> list[str]:
    lines = ["set -euo pipefail", f"cd {shell_word(cwd)}"]
    if roots:
        joined = shell_word(os.pathsep.join(roots))
        lines.append(f'export PYTHONPATH={joined}"${{PYTHONPATH:+:$PYTHONPATH}}"')
    if key_dir is not None:
        key = shell_word(str(Path(key_dir) / "checkpoint.key"))
        lines += [
            "# checkpoints are signed with the notebook's key (never copied into this folder)",
            f"export WORKBENCH_STATE_DIR={shell_word(key_dir)}",
            f"if [ ! -f {key} ]; then",
            f'  echo "error: the checkpoint key {key} is missing on $(hostname); share'
            ' that folder (mode 0700) or copy the key there with mode 0600" >&2',
            "  exit 1",
            "fi",
        ]
    return lines


def torchrun_script(argv: list[str], preamble: list[str]) -> str:
    port_flag = argv.index("--master-port")
    shown = [shell_word(a) for a in argv]
    shown[port_flag + 1] = f'"${{MASTER_PORT:-{argv[port_flag + 1]}}}"'
    # the launcher, its four flags one per line, then what it runs
    lines = [shown[0], *(" ".join(shown[i : i + 2]) for i in range(1, 9, 2)), " ".join(shown[9:])]
    body = " \\\n    ".join(lines)
    return "\n".join(["#!/bin/bash", "# one node", *preamble, body, ""])


# gloo binds the address this node's own hostname resolves to unless GLOO_SOCKET_IFNAME names
# an interface, and stock Debian/Ubuntu resolve a host's own name to 127.0.1.1, which no other
# node can reach (the job then hangs in gloo's connect). Each node names the interface it
# reaches another node of the job through: a peer's name resolves to its real address there.
_NODE_INTERFACE = r"""node_interface() {
  local peer addr
  command -v ip >/dev/null || return 0
  peer=$(scontrol show hostnames "$SLURM_JOB_NODELIST" | grep -vxF "$SLURMD_NODENAME" | head -n 1)
  [ -n "$peer" ] || return 0
  addr=$(getent ahostsv4 "$peer" | awk 'NR == 1 {print $1}')
  [ -n "$addr" ] || return 0
  ip -o route get "$addr" | sed -n 's/.* dev \([^ ]*\).*/\1/p'
}"""


def _srun_line(target: list[str], procs_per_node: int) -> str:
    """One ``torchrun`` per node, each with gloo on the interface that joins the nodes."""
    per_node = [
        "ifname=${GLOO_SOCKET_IFNAME:-$(node_interface)}",
        'if [ -n "$ifname" ]; then export GLOO_SOCKET_IFNAME=$ifname; fi',
        'exec "$TORCHRUN" --nnodes "$SLURM_JOB_NUM_NODES" \\',
        f"    --nproc-per-node {procs_per_node} \\",
        '    --rdzv-id "$SLURM_JOB_ID" --rdzv-backend c10d \\',
        '    --rdzv-endpoint "$MASTER_ADDR:$MASTER_PORT" "$@"',
    ]
    program = shlex.quote("\n".join(per_node))
    args = " ".join(shell_word(a) for a in target)
    return f"srun --kill-on-bad-exit=1 bash -c {program} \\\n    torchrun {args}"


def sbatch_script(target: list[str], shape: JobShape, preamble: list[str], name: str) -> str:
    """``srun`` starts one ``torchrun`` per node; they meet at the allocation's first node
    (by name: torchrun hosts the rendezvous on the node whose own name it is)."""
    head = [
        "#!/bin/bash",
        f"#SBATCH --job-name={_job_name(name)}",
        f"#SBATCH --nodes={shape.nodes}",
        "#SBATCH --ntasks-per-node=1",
        f"#SBATCH --cpus-per-task={shape.procs_per_node}",
    ]
    if shape.gpus:
        head.append(f"#SBATCH --gpus-per-node={shape.procs_per_node}")
    return "\n".join(
        [
            *head,
            *preamble,
            "# the first node of the allocation hosts the rendezvous",
            'MASTER_ADDR=$(scontrol show hostnames "$SLURM_JOB_NODELIST" | head -n 1)',
            f"MASTER_PORT=${{MASTER_PORT:-{DEFAULT_PORT}}}",
            f"TORCHRUN=${{TORCHRUN:-{shell_word(_torchrun())}}}",
            "export MASTER_ADDR MASTER_PORT TORCHRUN",
            _NODE_INTERFACE,
            "export -f node_interface",
            _srun_line(target, shape.procs_per_node),
            "",
        ]
    )


def write_export(
    directory: str | os.PathLike[str],
    *,
    shape: JobShape,
    job: dict[str, Any] | None = None,
    script: tuple[str, list[str]] | None = None,
    key_dir: str | None = None,
    port: int = DEFAULT_PORT,
) -> Export:
    """Write ``run.json`` (for ``job``) or nothing more (for ``script``: path, args), then
    ``torchrun.sh`` and ``job.sbatch``, into ``directory``."""
    folder = Path(directory).absolute()
    try:
        folder.mkdir(parents=True, exist_ok=True)
    except OSError as exc:  # a file there, or a folder we may not write into
        raise ConfigError(
            f"cannot export into {str(folder)!r}: {exc.strerror or exc}; give a folder "
            "that is new or empty and writable"
        ) from None
    files: dict[str, Path] = {}
    if job is not None:
        files["job"] = folder / JOB_FILE
        files["job"].write_text(json.dumps(job, indent=2) + "\n")
        target = ["-m", "workbench.parallel.job", str(files["job"])]
        roots, name = _module_roots(job), "workbench-run"
    elif script is not None:
        target, roots, name = [script[0], *script[1]], [], "workbench-" + Path(script[0]).stem
    else:
        raise ConfigError("write_export needs a job or a script")
    preamble = _preamble(os.getcwd(), roots, key_dir)
    argv = torchrun_argv(target, shape.procs_per_node, port=port)
    files["torchrun"] = folder / TORCHRUN_FILE
    files["torchrun"].write_text(torchrun_script(argv, preamble))
    files["sbatch"] = folder / SBATCH_FILE
    files["sbatch"].write_text(sbatch_script(target, shape, preamble, name))
    for kind in ("torchrun", "sbatch"):
        files[kind].chmod(0o755)
    return Export(directory=folder, torchrun=argv, files=files)
