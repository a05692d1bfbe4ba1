"""Kept clusters: a cluster that outlives its kernel (``keep=True`` / ``%wb start --keep``).

A kept cluster's processes already run in sessions of their own (ipyparallel's launchers,
the warm processes, the orphan watchdog), so a kernel's exit, restart or SIGKILL does not
reach them; what ends an ordinary cluster with its kernel is the kernel's ``atexit`` stop
and the watchdog (watchdog.py). A kept cluster is detached at exit instead of stopped, and
its watchdog is started with a lease: it follows whichever kernel holds the cluster
(``holder.json`` in the run directory) and ends everything once no kernel has held it for
the lease (``DEFAULT_LEASE_S`` unless ``lease=``), or at once when told (``%wb stop``).

What a new kernel needs to find it again is one JSON file per kept cluster, the
*connection file*: ``<state dir>/clusters/<name>.json`` (``config.state_dir``), the
directory mode 0700 and the file 0600, holding the controller's client connection (with
the cluster's key: whoever reads it can run code on the engines), the ranks, hosts and
settings, the run directory and the watchdog's pid. Only its owner can read it, and a file
that another user owns or could read is refused rather than used. A file whose watchdog is
gone (the machine rebooted, the lease ran out while the file was being replaced) is stale:
``KeptClusters.scan`` removes it and says so.

One kernel holds a kept cluster at a time: attaching one that another live kernel holds is
refused with that kernel's pid (the user detaches or stops it there, or restarts that
kernel); a second cluster in this kernel can be attached beside it.
"""

from __future__ import annotations

import json
import os
import re
import signal
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psutil

from workbench import validate
from workbench.cluster import watchdog
from workbench.config import not_private, state_dir
from workbench.errors import ClusterError

__all__ = [
    "DEFAULT_LEASE_S",
    "KeepSettings",
    "KeptCluster",
    "KeptClusters",
    "Scan",
    "foreign_setting",
    "keep_settings",
]

DEFAULT_LEASE_S = 3600.0  # a kept cluster no kernel holds ends after this long
_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,63}")
_FORMAT = 1
_DEFAULT_NAME = "default"
_END_WAIT_S = watchdog.REMOTE_S * 3 + 5  # the watchdog's local ends plus its remote phases


@dataclass(frozen=True, slots=True)
class KeepSettings:
    """What ``keep=True`` asked for: the lease and the name (None: the first free one)."""

    lease: float = DEFAULT_LEASE_S
    name: str | None = None


def check_name(option: str, name: object) -> str:
    """A kept cluster's name, or the standard error (it becomes a file name)."""
    if not isinstance(name, str) or not _NAME.fullmatch(name):
        raise validate.invalid(
            option,
            name,
            "not a kept cluster's name",
            "use letters, digits, '.', '_' and '-' (up to 64, a letter or digit first)",
        )
    return name


def foreign_setting(
    profile: str | None, cluster_id: str | None, names: tuple[str, str] = ("profile", "cluster_id")
) -> str | None:
    """The setting that connects to a cluster the workbench did not start, as the user
    wrote it (``cluster_id='x'``; ``--cluster-id x`` with the magic's ``names``), or None."""
    for name, value in zip(names, (profile, cluster_id), strict=True):
        if value is not None:
            return f"{name} {value}" if name.startswith("-") else f"{name}={value!r}"
    return None


def keep_settings(
    keep: object,
    lease: object,
    name: object,
    *,
    foreign: str | None,
    names: tuple[str, str, str] = ("keep", "lease", "name"),
) -> KeepSettings | None:
    """``keep``/``lease``/``name`` checked (None: an ordinary cluster). ``foreign`` names
    the setting that connects to a cluster the workbench did not start (``cluster_id=...``),
    which it can neither keep nor end. ``names``: how the caller spells the three."""
    if not isinstance(keep, bool):
        raise validate.invalid(names[0], keep, "not True or False", "use keep=True or keep=False")
    seconds = validate.seconds(names[1], lease)
    if name is not None:
        check_name(names[2], name)
    if not keep:
        if name is not None:
            raise validate.invalid(
                names[2], name, "only a kept cluster has a name", f"add {names[0]}, or leave it out"
            )
        return None
    if foreign is not None:
        raise validate.invalid(
            names[0],
            keep,
            f"{foreign} connects to a cluster the workbench did not start, which it cannot "
            "keep alive or end",
            f"leave out {re.split('[= ]', foreign)[0]} to start a kept cluster, or leave out "
            f"{names[0]}",
        )
    assert seconds is not None
    return KeepSettings(lease=seconds, name=name)  # type: ignore[arg-type]


def _process(info: Any) -> psutil.Process | None:
    """The running process ``{"pid", "started"}`` names (None: gone, or a reused pid)."""
    try:
        proc = psutil.Process(int(info["pid"]))
        if abs(proc.create_time() - float(info["started"])) < 1.0 and proc.is_running():
            return proc if proc.status() != psutil.STATUS_ZOMBIE else None
    except (psutil.Error, TypeError, KeyError, ValueError):
        pass
    return None


def process_info(proc: psutil.Process) -> dict[str, float]:
    return {"pid": proc.pid, "started": proc.create_time()}


@dataclass(slots=True)
class KeptCluster:
    """One kept cluster's connection file, read (``data``) and where it lies."""

    path: Path
    data: dict[str, Any] = field(default_factory=dict)

    @property
    def name(self) -> str:
        return str(self.data["name"])

    @property
    def run_dir(self) -> str:
        return str(self.data["run_dir"])

    def watchdog(self) -> psutil.Process | None:
        return _process(self.data.get("watchdog"))

    def controller(self) -> psutil.Process | None:
        return _process(self.data.get("controller"))

    def holder(self) -> int | None:
        """The pid of the live kernel that holds it (None: none does)."""
        try:
            info = json.loads((Path(self.run_dir) / watchdog.HOLDER).read_text())
        except (OSError, ValueError):
            return None
        proc = _process(info) if info.get("pid") else None
        return proc.pid if proc is not None else None

    def lease_left(self) -> float:
        """Seconds until it ends by itself (the whole lease while a kernel holds it)."""
        lease = float(self.data["lease_s"])
        try:
            since = json.loads((Path(self.run_dir) / watchdog.LEASE).read_text())["detached_at"]
        except (OSError, ValueError, KeyError, TypeError):
            since = None
        if since is None or self.holder() is not None:
            return lease
        return max(0.0, lease - (time.time() - float(since)))

    def row(self) -> dict[str, Any]:
        """What ``%wb list`` shows of it."""
        holder = self.holder()
        ranks = self.data.get("ranks") or []
        return {
            "name": self.name,
            "ranks": len(ranks),
            "hosts": ",".join(dict.fromkeys(str(r["host"]) for r in ranks)),
            "launcher": self.data["config"]["launcher"],
            "age_s": time.time() - float(self.data["created"]),
            "lease_left_s": self.lease_left(),
            "attached": (
                "no"
                if holder is None
                else "this kernel"
                if holder == os.getpid()
                else f"kernel pid {holder}"
            ),
        }

    def end(self) -> None:
        """End it now through its watchdog (it ends every process and removes the run
        directory), then remove this file."""
        dog = self.watchdog()
        if dog is not None:
            dog.send_signal(signal.SIGUSR1)
            try:
                dog.wait(_END_WAIT_S)
            except psutil.TimeoutExpired:
                raise ClusterError(
                    f"kept cluster {self.name!r}: its watchdog (pid {dog.pid}) did not end it "
                    f"within {_END_WAIT_S:.0f} s; its processes may still run"
                ) from None
        self.remove()

    def remove(self) -> None:
        """Remove the file if it is still this cluster's (a new one may have its name)."""
        try:
            if json.loads(self.path.read_text()).get("run_dir") == self.data.get("run_dir"):
                self.path.unlink()
        except (OSError, ValueError):
            pass


@dataclass(frozen=True, slots=True)
class Scan:
    """The kept clusters found, and the stale files removed on the way (named)."""

    live: list[KeptCluster]
    removed: list[str]

    def notice(self) -> str:
        """One line about what was cleaned up ('' when nothing was)."""
        if not self.removed:
            return ""
        return (
            f"workbench: removed the connection file of {len(self.removed)} kept cluster(s) "
            f"whose processes are gone: {', '.join(self.removed)}"
        )


class KeptClusters:
    """The user's directory of kept clusters' connection files (one owner: this class)."""

    def __init__(self, root: Path | None = None) -> None:
        self.root = (root or state_dir()) / "clusters"

    def _checked(self, path: Path) -> None:
        """Refuse what another user owns or could read (the key is in there)."""
        problem = not_private(path)
        if problem == "owner":
            raise ClusterError(
                f"{path} belongs to another user: only the user who started a kept cluster "
                "can attach to it"
            )
        if problem is not None:
            raise ClusterError(
                f"{path} can be read or written by other users ({problem}): it holds a "
                f"cluster's key; run `chmod {'700' if path.is_dir() else '600'} {path}`"
            )

    def directory(self) -> Path:
        """The directory, made private if new, checked if not."""
        try:
            self.root.parent.mkdir(parents=True, exist_ok=True)
            self.root.mkdir(mode=0o700, exist_ok=True)
            self._checked(self.root)
        except PermissionError as exc:
            raise ClusterError(
                f"cannot use {self.root} ({exc.strerror}): only the user who started a kept "
                "cluster can attach to it; set WORKBENCH_STATE_DIR to a directory of your own"
            ) from None
        return self.root

    def path_of(self, name: str) -> Path:
        return self.directory() / f"{name}.json"

    def scan(self) -> Scan:
        """Every kept cluster whose watchdog runs; the files of the others are removed."""
        live: list[KeptCluster] = []
        removed: list[str] = []
        for path in sorted(self.directory().glob("*.json")):
            try:
                self._checked(path)
                data = json.loads(path.read_text())
                kept = KeptCluster(path, data)
                if data.get("format") != _FORMAT or kept.watchdog() is None:
                    raise ValueError("stale")
            except ClusterError:
                raise
            except (OSError, ValueError, KeyError, TypeError, AttributeError):
                removed.append(path.stem)
                path.unlink(missing_ok=True)
                continue
            live.append(kept)
        return Scan(live, removed)

    def find(self, name: str | None, option: str = "name") -> tuple[KeptCluster, Scan]:
        """The kept cluster ``name`` (None: the only one no live kernel holds), or one
        clear error naming the kept clusters there are."""
        if name is not None:
            check_name(option, name)
        scan = self.scan()
        names = ", ".join(repr(k.name) for k in scan.live) or "none"
        if name is not None:
            for kept in scan.live:
                if kept.name == name:
                    return kept, scan
            raise validate.invalid(
                option,
                name,
                "no kept cluster has that name"
                + (f" ({scan.notice().removeprefix('workbench: ')})" if scan.removed else ""),
                f"kept clusters: {names} (`%wb list`)",
            )
        free = [k for k in scan.live if k.holder() is None]
        if len(free) == 1:
            return free[0], scan
        if not scan.live:
            why = "no kept cluster runs" + (f"; {scan.notice()}" if scan.removed else "")
            raise ClusterError(f"{why}; start one with `%wb start -n 2 --keep`")
        raise ClusterError(
            f"name the kept cluster to attach: {names} ({len(free)} not held by a kernel); "
            "`%wb list` shows them"
        )

    def take(self, name: str | None) -> KeptCluster:
        """The kept cluster ``name`` for this kernel to attach (see ``find``), or one clear
        error: another live kernel holds it; its controller died while no kernel held it
        (then it is ended, file and all: nothing could reach its engines any more)."""
        kept, _ = self.find(name)
        holder = kept.holder()
        if holder is not None and holder != os.getpid():
            raise ClusterError(
                f"kept cluster {kept.name!r} is attached to another kernel (pid {holder}): "
                "run `wb.Cluster.current().detach_sync()` or `%wb stop` there, or restart "
                "that kernel, then attach here"
            )
        if kept.data.get("controller") and kept.controller() is None:
            kept.end()
            raise ClusterError(
                f"kept cluster {kept.name!r} had lost its ipyparallel controller (pid "
                f"{kept.data['controller']['pid']}), so nothing could reach its engines: "
                "its processes were ended and its file removed; start a new one"
            )
        return kept

    def free_name(self, wanted: str | None) -> str:
        """``wanted`` if no live kept cluster has it (else an error), or the first free
        default name."""
        taken = {k.name for k in self.scan().live}
        if wanted is not None:
            if wanted in taken:
                raise validate.invalid(
                    "name",
                    wanted,
                    "a kept cluster of that name runs",
                    f"attach it (`%wb attach {wanted}`), stop it, or choose another name",
                )
            return wanted
        n = 1
        while (_DEFAULT_NAME if n == 1 else f"{_DEFAULT_NAME}-{n}") in taken:
            n += 1
        return _DEFAULT_NAME if n == 1 else f"{_DEFAULT_NAME}-{n}"

    def write(self, name: str, data: dict[str, Any]) -> KeptCluster:
        """Write ``name``'s connection file, mode 0600 from its creation on."""
        path = self.path_of(name)
        tmp = path.with_suffix(f".tmp-{os.getpid()}")
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w") as f:
            json.dump({"format": _FORMAT, "name": name, **data}, f)
        os.replace(tmp, path)
        return KeptCluster(path, json.loads(path.read_text()))
