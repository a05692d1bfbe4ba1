"""Multi-node launchers: their options, the ipyparallel settings built from them, and checks
that turn a launcher's failure into one clear sentence with the launcher's own output.

Defaults make each launcher work out of the box where the machines are set up as the
scheduler expects: the same interpreter path on every node (``remote_python`` defaults to
the kernel's own ``sys.executable``), passwordless ssh, Debian's openmpi, a working Slurm.
The controller listens only on this host's address on the network that reaches the other
hosts (or on the interface the user names), never on every interface.
"""

from __future__ import annotations

import asyncio
import os
import shlex
import shutil
import subprocess
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import psutil

from workbench.cluster.launch import mpi
from workbench.cluster.launch.slurm import SlurmJobsEngineSetLauncher
from workbench.cluster.launch.ssh import SSHParallelEngineSetLauncher
from workbench.engine import hosts as hostinfo
from workbench.errors import ClusterError, ConfigError

__all__ = [
    "LAUNCHER_OPTIONS",
    "LauncherOptions",
    "close_ssh",
    "controller_address",
    "engines_per_host",
    "ipp_settings",
    "launcher_output",
    "mpi_args",
    "parse_options",
    "preflight",
    "sbatch_args",
    "ssh_args",
]

_COMMON = ("network_interface", "status_dir")
LAUNCHER_OPTIONS: dict[str, tuple[str, ...]] = {
    "local": (),
    "ssh": ("remote_python", "ssh_args", *_COMMON),
    "mpi": ("hostfile", "mpi_args", "mpiexec", *_COMMON),
    "slurm": ("partition", "time", "account", "sbatch_args", *_COMMON),
}
_LISTS = {"ssh_args", "mpi_args", "sbatch_args"}
# Never let ssh ask for a password inside a kernel (it would wait forever, unseen). A host
# that goes silent (powered off: no reset) would hang every ssh multiplexed over its shared
# connection: keep-alives end that connection ~6 s after the host stops answering.
_SSH_DEFAULTS = (
    *("-o", "BatchMode=yes", "-o", "ConnectTimeout=10"),
    *("-o", "ServerAliveInterval=2", "-o", "ServerAliveCountMax=3"),
)
_PREFLIGHT_S = 30.0
# One ssh connection per host, shared by every ssh the cluster runs (0.01 s instead of
# ~0.4 s per round trip). The master exits 10 s after its last session, so even a kernel
# killed outright leaves no ssh behind for long; a normal stop closes it at once.
_CONTROL_PERSIST_S = 10


def ssh_args(options: LauncherOptions, control_dir: str | None) -> list[str]:
    """ssh's options: the safe defaults, connection sharing in ``control_dir``, the user's."""
    args = list(_SSH_DEFAULTS)
    if control_dir:
        args += [
            "-o", "ControlMaster=auto",
            "-o", f"ControlPath={control_dir}/ssh-%C",
            "-o", f"ControlPersist={_CONTROL_PERSIST_S}",
        ]  # fmt: skip
    return args + list(options.ssh_args)


@dataclass(frozen=True, slots=True, kw_only=True)
class LauncherOptions:
    """Validated launcher options (see ``LAUNCHER_OPTIONS`` for which launcher takes which)."""

    remote_python: str = ""
    ssh_args: tuple[str, ...] = ()
    network_interface: str = ""
    status_dir: str = ""  # shared by every node: the ranks' status files (hang reports)
    hostfile: str = ""
    mpi_args: tuple[str, ...] = ()
    mpiexec: str = "mpiexec"
    partition: str = ""
    time: str = ""
    account: str = ""
    sbatch_args: tuple[str, ...] = ()

    @property
    def python(self) -> str:
        """The engines' interpreter on other nodes: the same path as the kernel's."""
        return self.remote_python or sys.executable


def parse_options(launcher: str, options: Mapping[str, Any] | None) -> LauncherOptions:
    """Check ``launcher_options`` for ``launcher``: known keys, strings, lists of strings."""
    if options is None:
        return LauncherOptions()
    if not isinstance(options, Mapping):
        raise ConfigError(f"launcher_options={options!r} must be a dict of option -> value")
    valid = LAUNCHER_OPTIONS.get(launcher, ())
    bad = sorted(k for k in options if k not in valid)
    if bad:
        choices = ", ".join(valid) if valid else "none (it runs engines on this machine)"
        raise ConfigError(
            f"launcher_options {bad} are not options of launcher={launcher!r}; "
            f"its options: {choices}"
        )
    values: dict[str, Any] = {}
    for key, value in options.items():
        if key in _LISTS:
            if isinstance(value, str) or not isinstance(value, Sequence):
                raise ConfigError(
                    f"launcher_options[{key!r}]={value!r} must be a list of strings, "
                    f"e.g. ['-o', 'Port=2222']"
                )
            if not all(isinstance(v, str) for v in value):
                raise ConfigError(f"launcher_options[{key!r}]={value!r}: every item must be a str")
            values[key] = tuple(value)
        else:
            if not isinstance(value, str) or not value.strip():
                raise ConfigError(f"launcher_options[{key!r}]={value!r} must be a non-empty str")
            values[key] = value.strip()
    if "status_dir" in values and not os.path.isdir(values["status_dir"]):
        raise ConfigError(
            f"launcher_options['status_dir']={values['status_dir']!r} is not a directory; "
            "name a directory that every node shares (e.g. on the shared home)"
        )
    return LauncherOptions(**values)


def engines_per_host(hosts: Sequence[str], n: int) -> dict[str, int]:
    """Engines round-robin over ``hosts`` (``{host: count}``, in the order given)."""
    per_host: dict[str, int] = {}
    for i in range(n):
        host = hosts[i % len(hosts)]
        per_host[host] = per_host.get(host, 0) + 1
    return per_host


def _hostfile_hosts(path: str) -> list[str]:
    try:
        with open(path) as f:
            lines = [line.split("#", 1)[0].split() for line in f]
    except OSError as exc:
        raise ConfigError(f"launcher_options['hostfile']={path!r} cannot be read: {exc}") from None
    return [words[0] for words in lines if words]


def controller_address(launcher: str, hosts: Sequence[str], options: LauncherOptions) -> str | None:
    """This host's address that the engines' hosts reach (None: not knowable here)."""
    targets = list(hosts)
    if launcher == "mpi" and not targets and options.hostfile:
        targets = _hostfile_hosts(options.hostfile)
    if options.network_interface:
        try:
            address = hostinfo.interface_address(options.network_interface)
        except ConfigError:
            address = ""  # the login host may name its interfaces differently: use the route
        if address and hostinfo.is_loopback(address) and targets:
            raise ConfigError(
                f"network_interface={options.network_interface!r} has the loopback address "
                f"{address} here, which the other hosts ({', '.join(targets)}) cannot reach; "
                "name the interface of the network that joins the hosts (e.g. 'eth0')"
            )
        if address:
            return address
    for host in targets:
        address = hostinfo.resolve(host)
        if hostinfo.is_loopback(address):
            continue  # this machine itself, by a name that maps to loopback
        return hostinfo.route_source(address)
    # only this machine (ssh to localhost): loopback; nothing known (slurm picks): None
    return "127.0.0.1" if targets else None


def ipp_settings(
    launcher: str,
    n: int,
    hosts: Sequence[str],
    options: LauncherOptions,
    address: str | None,
    control_dir: str | None = None,
    run_dir: str | None = None,
) -> dict[str, Any]:
    """Keyword arguments for ``ipyparallel.Cluster`` beyond the workbench's common ones."""
    from traitlets.config import Config

    cfg = Config()
    kwargs: dict[str, Any] = {"config": cfg}
    if launcher == "local":
        kwargs.update(engines="local", controller_ip="127.0.0.1")
        return kwargs
    # Listen where the engines connect from, not on every interface.
    kwargs["controller_ip"] = address or "*"
    if address:
        kwargs["controller_location"] = address
    if launcher == "ssh":
        kwargs["engines"] = SSHParallelEngineSetLauncher
        cfg.SSHLauncher.remote_python = options.python
        args = ssh_args(options, control_dir)
        cfg.SSHLauncher.ssh_args = args
        cfg.SSHLauncher.scp_args = list(args)
        cfg.SSHEngineSetLauncher.engines = engines_per_host(hosts, n)
        cfg.SSHEngineSetLauncher.delay = 0.0
    elif launcher == "mpi":
        kwargs["engines"] = "mpi"
        cfg.MPILauncher.mpi_cmd = [options.mpiexec]
        cfg.MPIEngineSetLauncher.mpi_args = mpi_args(n, hosts, options, address, run_dir)
    else:
        # one job per engine (launch/slurm.py): a dead engine's job frees its CPUs, so a
        # replacement job can start on its node
        kwargs["engines"] = SlurmJobsEngineSetLauncher
        jobs = cfg.SlurmJobsEngineSetLauncher
        jobs.engines = engines_per_host(hosts, n) if hosts else {}
        jobs.sbatch_args = sbatch_args(options)
        if run_dir:  # sbatch reads (and copies) the scripts here; the notebook's folder
            # may not be writable
            jobs.batch_dir = run_dir
    return kwargs


def _cidr(address: str) -> str | None:
    """The network (a.b.c.d/len) of the interface holding ``address`` on this host."""
    import ipaddress

    for addrs in psutil.net_if_addrs().values():
        for a in addrs:
            if a.address == address and a.netmask:
                return str(ipaddress.ip_network(f"{address}/{a.netmask}", strict=False))
    return None


def mpi_args(
    n: int,
    hosts: Sequence[str],
    options: LauncherOptions,
    address: str | None,
    run_dir: str | None,
) -> list[str]:
    """mpiexec's options: where the engines go, which network, what environment."""
    args: list[str] = []
    if options.hostfile:
        args += ["--hostfile", options.hostfile]
    elif hosts and run_dir:  # hosts=[...]: engines round-robin, as for ssh
        path = os.path.join(run_dir, "hostfile")
        with open(path, "w") as f:
            f.writelines(f"{h} slots={k}\n" for h, k in engines_per_host(hosts, n).items())
        args += ["--hostfile", path]
    if mpi.is_openmpi(options.mpiexec):
        network = _cidr(address) if address else None
        if network:  # keep openmpi's own traffic on the network that joins the hosts
            args += ["--mca", "oob_tcp_if_include", network, "--mca", "btl_tcp_if_include", network]
        # openmpi (unlike MPICH) forwards no environment to other hosts unless told: without
        # these the engines there never find the controller
        for name in ("IPP_CONNECTION_INFO", "IPP_CLUSTER_ID", "IPP_PROFILE_DIR"):
            args += ["-x", name]
    return args + list(options.mpi_args)


def sbatch_args(options: LauncherOptions) -> list[str]:
    """Every engine job's sbatch options: partition, account, time limit, the user's own
    (each job adds its node and ``--nodes=1 --ntasks=1``; see launch/slurm.py)."""
    args = [
        f"--{flag}={value}"
        for flag, value in (
            ("partition", options.partition),
            ("account", options.account),
            ("time", options.time),
        )
        if value
    ]
    return args + list(options.sbatch_args)


_CHECK = (
    "import importlib.util as u, sys; "
    "print('missing:' + ','.join(m for m in ('ipyparallel', 'workbench', 'torch', {extra}) "
    "if m and u.find_spec(m) is None))"
)


def _check_host(
    launcher: str, host: str, options: LauncherOptions, control_dir: str | None
) -> str | None:
    extra = repr("mpi4py") if launcher == "mpi" else "''"
    remote = f"{shlex.quote(options.python)} -c {shlex.quote(_CHECK.format(extra=extra))}"
    argv = ["ssh", *ssh_args(options, control_dir), host, remote]
    try:
        done = subprocess.run(argv, capture_output=True, text=True, timeout=_PREFLIGHT_S)
    except subprocess.TimeoutExpired:
        return f"ssh to {host} did not answer within {_PREFLIGHT_S:.0f}s ({' '.join(argv[:-1])})"
    stderr = done.stderr.strip()
    if done.returncode == 255:
        return f"ssh to {host} failed (passwordless ssh is needed):\n{stderr}"
    if done.returncode == 127 or "No such file" in stderr or "not found" in stderr:
        return (
            f"remote_python {options.python!r} does not exist on {host}; install the same "
            "environment at the same path on every node, or pass "
            f"launcher_options={{'remote_python': '/path/to/python'}}:\n{stderr}"
        )
    missing = [m for line in done.stdout.splitlines() if line.startswith("missing:")
               for m in line[len("missing:"):].split(",") if m]  # fmt: skip
    if done.returncode != 0:
        return f"{options.python} failed on {host} (exit {done.returncode}):\n{stderr}"
    if missing:
        return (
            f"{options.python} on {host} lacks {missing}; install the workbench's "
            "environment on every node (the same path as on this machine)"
        )
    return None


async def preflight(
    launcher: str,
    n: int,
    hosts: Sequence[str],
    options: LauncherOptions,
    control_dir: str | None,
) -> None:
    """Before any engine starts: every ssh host answers and has the engines' interpreter.
    (This also opens the shared ssh connection to each host.)"""
    if launcher == "mpi":
        mpi.preflight_mpi(options)
        mpi.check_mpi_slots(n, hosts, options)
    if launcher == "slurm" and shutil.which("sbatch") is None:
        raise ClusterError(
            "launcher='slurm' needs sbatch on PATH (the Slurm client: apt-get install slurm-client)"
        )
    if launcher not in ("ssh", "mpi") or not hosts:
        return
    problems = await asyncio.gather(
        *(
            asyncio.to_thread(_check_host, launcher, h, options, control_dir)
            for h in dict.fromkeys(hosts)
        )
    )
    found = [p for p in problems if p]
    if found:
        raise ClusterError(f"launcher={launcher!r} cannot start engines: " + "\n".join(found))


def launcher_output(ipp_cluster: Any, limit: int = 3000) -> str:
    """The engine launchers' own output (stderr of mpiexec / sbatch / ssh), last part."""
    parts = []
    for engine_set in getattr(ipp_cluster, "engines", {}).values():
        try:
            out = engine_set.get_output()
        except Exception as exc:  # the output may be unreachable (a lost host)
            out = f"(output unavailable: {exc})"
        if isinstance(out, dict):
            out = "\n".join(f"[{k}] {v}" for k, v in out.items() if v)
        if out:
            parts.append(str(out))
    text = "\n".join(parts).strip()
    return text[-limit:]


async def close_ssh(hosts: Sequence[str], options: LauncherOptions, control_dir: str) -> None:
    """End the shared ssh connections (``ssh -O exit``), one per host, all at once."""

    def close(host: str) -> None:
        argv = ["ssh", *ssh_args(options, control_dir), "-O", "exit", host]
        subprocess.run(argv, capture_output=True, timeout=15, check=False)

    await asyncio.gather(*(asyncio.to_thread(close, h) for h in dict.fromkeys(hosts)))
