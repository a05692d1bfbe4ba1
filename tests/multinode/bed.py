"""A 2-node cluster on one Linux machine, for the multi-node launcher tests (root only).

Layout (every name and address below belongs to the bed; nothing else is touched):

- login node = this machine's own PID namespace; the kernel-side process (the "notebook")
  runs here as the bed's plain user, in a private mount namespace whose ``/etc/hosts``
  names the nodes. A bridge ``wbmnbr0`` holds the login address ``SUBNET.1``.
- node i = its own network, PID, mount and UTS namespace: hostname ``wbmn<i>``, address
  ``SUBNET.(10+i)`` on a veth joined to the bridge (MAC ``MAC_PREFIX:i``, fixed: see
  ``_link_node``), its own ``/etc/hosts`` (``cluster``
  style: the hostname maps to the node's address; ``debian`` style: to 127.0.1.1, as stock
  Debian/Ubuntu write it), its own ``/tmp`` and sshd, and pids starting at 20000 + 4000*i.
- user = a plain account created for the bed, with its home under the bed directory
  (shared by every node, like an NFS home), an ssh key that logs into every node, and the
  nodes' host key in ``known_hosts`` (no host-key checks are switched off).
- no node has a default route: no traffic can leave the machine.
- python = a venv on the disk every node shares (``/var/tmp/wbmn-venv-<key>``) made from the
  nodes' own interpreter (Debian 12's ``/usr/bin/python3``, 3.11.2; ``WB_BED_PYTHON`` for
  another), with the project installed as a cluster user installs it (``pip install -c
  constraints.txt torch==...`` then ``'.[mpi]'``: a regular install on the shared disk, so a
  checkout under ``/tmp`` works too). The "notebook" (``drive``) and every engine run from
  it, so the bed runs what a user's cluster runs, not the kernel's own venv. Making it takes
  minutes, so it is kept between beds, keyed by the interpreter, this checkout and its
  ``constraints.txt`` / ``pyproject.toml``; a changed package is reinstalled (seconds) at the
  next bed (``ensure_venv``; the multi-node conftest starts it in the background as soon as
  the bed's tests are collected).

Everything started is stopped by pid or by namespace: a node's processes all end with its
PID-namespace init. ``python -m tests.multinode.bed up|down|status`` drives it by hand.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import os
import pwd
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psutil

__all__ = ["REQUIRED_COMMANDS", "Bed", "BedError", "unavailable_reason"]

STATE_FILE = Path("/run/wbmn-bed.json")
BRIDGE = "wbmnbr0"
SUBNET = os.environ.get("WB_BED_SUBNET", "10.231.77")
MAC_PREFIX = "02:77:62:6d:00"  # locally administered; the last byte is the node's index
USER = "wbmn"
SLURMCTLD_PORT = 16817
SLURMD_PORT = 16818
# Slurm nodes configured beyond the bed's own, DOWN until ``add_node`` starts them (a node
# cannot join a running slurmctld's configuration): the spare host of test_slurm_spare.py.
SLURM_SPARES = 1
PID_BASE = 20000
PID_STEP = 4000
NODE_INIT = Path(__file__).with_name("node_init.py")
CHECKOUT = Path(__file__).resolve().parents[2]
NODE_PYTHON = os.environ.get("WB_BED_PYTHON", "/usr/bin/python3")
TORCH_PIN = "torch==2.13.0"  # as the README's set-up installs it
DRIVER = Path(__file__).with_name("driver.py")
# The interpreter's own install (a venv's base) and this checkout (with its venv): every
# bed process must be able to read them, wherever they are (node_init.expose).
EXPOSE = sorted({os.path.realpath(sys.base_prefix), str(Path(__file__).resolve().parents[2])})
REQUIRED_COMMANDS = (
    "ip",
    "unshare",
    "nsenter",
    "setpriv",
    "useradd",
    "userdel",
    "ssh",
    "ssh-keygen",
    "/usr/sbin/sshd",
)


class BedError(RuntimeError):
    """The bed could not be built or torn down."""


def venv_dir() -> Path:
    """Where the bed's venv lives: one per interpreter, checkout and pinned install."""
    h = hashlib.sha256(f"{os.path.realpath(NODE_PYTHON)}\n{CHECKOUT}\n".encode())
    for name in ("constraints.txt", "pyproject.toml"):
        h.update((CHECKOUT / name).read_bytes())
    return Path("/var/tmp") / f"wbmn-venv-{h.hexdigest()[:12]}"


def ensure_venv() -> Path:
    """Make the bed's venv unless a complete one exists (one maker at a time: a lock), and
    install this checkout's package into it when its sources changed since the last install.

    The package is a regular install, not an editable one: an editable install points into
    the checkout, which a node cannot see when the checkout is under ``/tmp`` (every node
    mounts its own) — as on a real cluster, where a user installs onto the shared disk."""
    venv = venv_dir()
    done = venv / ".complete"
    pip = [str(venv / "bin" / "python"), "-m", "pip", "install", "-q"]
    constraints = ["-c", str(CHECKOUT / "constraints.txt")]
    with open(f"{venv}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            if not done.exists():
                shutil.rmtree(venv, ignore_errors=True)  # a make that died halfway
                if shutil.which(NODE_PYTHON) is None:
                    raise BedError(f"the bed's nodes need {NODE_PYTHON} (set WB_BED_PYTHON)")
                _run(NODE_PYTHON, "-m", "venv", str(venv), timeout=300)
                _run(*pip, *constraints, TORCH_PIN, "numpy", timeout=1800)
                _run(*pip, *constraints, f"{CHECKOUT}[mpi]", timeout=1800)
                (venv / ".package").write_text(package_digest())
                done.touch()
            elif _read(venv / ".package") != package_digest():
                # the code changed since the install (the pins did not: they key the venv)
                _run(*pip, "--no-deps", "--force-reinstall", str(CHECKOUT), timeout=600)
                (venv / ".package").write_text(package_digest())
        except subprocess.CalledProcessError as exc:
            raise BedError(f"the bed's venv could not be made: {exc.stderr[-3000:]}") from None
    return venv


def _read(path: Path) -> str:
    return path.read_text() if path.exists() else ""


def package_digest() -> str:
    """A digest of the package's files as they are now in this checkout."""
    h = hashlib.sha256()
    root = CHECKOUT / "workbench"
    for path in sorted(root.rglob("*")):
        if path.is_file() and "__pycache__" not in path.parts:
            h.update(f"{path.relative_to(root)}\n".encode())
            h.update(path.read_bytes())
    return h.hexdigest()


def _run(*argv: str, check: bool = True, **kw: object) -> subprocess.CompletedProcess[str]:
    return subprocess.run(list(argv), check=check, text=True, capture_output=True, **kw)  # type: ignore[call-overload, no-any-return]


def unavailable_reason() -> str | None:
    """Why the bed cannot be built here (None when it can)."""
    if sys.platform != "linux":
        return "the multi-node bed needs Linux network/PID namespaces"
    if os.geteuid() != 0:
        return "the multi-node bed needs root (network namespaces, a bridge, a test user)"
    missing = [c for c in REQUIRED_COMMANDS if shutil.which(c) is None]
    if missing:
        return (
            f"the multi-node bed needs {', '.join(missing)} "
            "(apt-get install iproute2 util-linux openssh-server openssh-client)"
        )
    probe = _run("unshare", "--net", "--pid", "--mount", "--uts", "--fork", "true", check=False)
    if probe.returncode != 0:
        return f"namespaces are not available here: {probe.stderr.strip()}"
    if STATE_FILE.exists():
        return f"a bed is already up ({STATE_FILE}); run `python -m tests.multinode.bed down`"
    taken = _run("ip", "-o", "addr", check=False).stdout
    if f" {SUBNET}." in taken or BRIDGE in taken:
        return f"{SUBNET}.0/24 or {BRIDGE} is already in use on this machine (set WB_BED_SUBNET)"
    return None


@dataclass(slots=True)
class Node:
    index: int
    name: str
    ip: str
    unshare_pid: int = 0

    def init_pid(self) -> int:
        """The root-namespace pid of the node's PID 1 (the unshare process's child)."""
        children = psutil.Process(self.unshare_pid).children()
        if not children:
            raise BedError(f"node {self.name} is not running")
        return children[0].pid


@dataclass(slots=True)
class Bed:
    nnodes: int = 2
    hosts_style: str = "cluster"  # or "debian": the hostname maps to 127.0.1.1
    # outside /tmp, which every node replaces with its own: the bed's files are shared
    # (made by up(), so a bed that cannot be built leaves no directory)
    root: Path = Path("/nonexistent")
    user: str = USER
    created_user: bool = False
    nodes: list[Node] = field(default_factory=list)
    login_ip: str = f"{SUBNET}.1"
    slurm: bool = False  # munged + slurmctld here, slurmd on every node (partition "wb")
    daemons: list[int] = field(default_factory=list)  # login-node daemons' pids (slurm)

    # ------------------------------------------------------------------ facts
    @property
    def home(self) -> Path:
        return self.root / "home"

    @property
    def python(self) -> Path:
        """The interpreter of the bed's venv (the driver's and every engine's)."""
        return venv_dir() / "bin" / "python"

    @property
    def uid(self) -> int:
        return pwd.getpwnam(self.user).pw_uid

    @property
    def gid(self) -> int:
        return pwd.getpwnam(self.user).pw_gid

    @property
    def login_hosts_file(self) -> Path:
        return self.root / "login" / "hosts"

    def user_env(self, extra: dict[str, str] | None = None) -> dict[str, str]:
        """A clean login environment for the bed user (nothing of root's leaks in)."""
        home = str(self.home)
        env = {
            "PATH": "/usr/local/bin:/usr/bin:/bin",
            "HOME": home,
            "USER": self.user,
            "LOGNAME": self.user,
            "LANG": "C.UTF-8",
            "IPYTHONDIR": f"{home}/.ipython",
            "JUPYTER_CONFIG_DIR": f"{home}/.jupyter",
            "JUPYTER_DATA_DIR": f"{home}/.local/share/jupyter",
            "JUPYTER_RUNTIME_DIR": f"{home}/.local/share/jupyter/runtime",
            "OMP_NUM_THREADS": "1",
            "PYTHONDONTWRITEBYTECODE": "1",
        }
        if self.slurm:
            env["SLURM_CONF"] = str(self.slurm_conf)
        if "WB_CI_RUN_TOKEN" in os.environ:  # CI's clean-up finds what this run started
            env["WB_CI_RUN_TOKEN"] = os.environ["WB_CI_RUN_TOKEN"]
        env.update(extra or {})
        return env

    # ------------------------------------------------------------------ up
    def up(self) -> Bed:
        reason = unavailable_reason()
        if reason is not None:
            raise BedError(reason)
        self.root = Path(tempfile.mkdtemp(prefix="wbmn-", dir="/var/tmp"))
        self.root.chmod(0o755)
        self._save()  # from here on, `down` can undo whatever part was built
        try:
            self._make_user()
            self._make_venv()
            self._make_network()
            if self.slurm:
                self._start_slurm_controller()
            self._start_nodes()
            self._wait_for_ssh()
            if self.slurm:
                self._wait_for_slurm()
        except BaseException:
            self.down()
            raise
        return self

    def _save(self) -> None:
        state = {
            "root": str(self.root),
            "user": self.user,
            "created_user": self.created_user,
            "nodes": [[n.index, n.name, n.ip, n.unshare_pid] for n in self.nodes],
            "nnodes": self.nnodes,
            "hosts_style": self.hosts_style,
            "slurm": self.slurm,
            "daemons": self.daemons,
        }
        STATE_FILE.write_text(json.dumps(state))

    @classmethod
    def load(cls) -> Bed:
        state = json.loads(STATE_FILE.read_text())
        return cls(
            nnodes=state["nnodes"],
            hosts_style=state["hosts_style"],
            root=Path(state["root"]),
            user=state["user"],
            created_user=state["created_user"],
            nodes=[Node(i, name, ip, pid) for i, name, ip, pid in state["nodes"]],
            slurm=state.get("slurm", False),
            daemons=state.get("daemons", []),
        )

    def _make_user(self) -> None:
        try:
            pwd.getpwnam(self.user)
            raise BedError(
                f"user {self.user!r} already exists; remove it (userdel -r {self.user}) or "
                "run `python -m tests.multinode.bed down` if a bed was left up"
            )
        except KeyError:
            pass
        _run(
            "useradd",
            "--no-create-home",
            "--home-dir",
            str(self.home),
            "--shell",
            "/bin/bash",
            "--user-group",
            self.user,
        )
        self.created_user = True
        self._save()
        _run("usermod", "-p", "*", self.user)  # no password, but not locked (sshd refuses locked)
        ssh = self.home / ".ssh"
        ssh.mkdir(parents=True, mode=0o700)
        (self.root / "login").mkdir()
        _run("ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(ssh / "id_ed25519"))
        shutil.copy(ssh / "id_ed25519.pub", ssh / "authorized_keys")
        hostkey = self.root / "ssh_host_ed25519_key"
        _run("ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(hostkey))
        pub = Path(f"{hostkey}.pub").read_text().split()
        names = [f"wbmn{i},{SUBNET}.{10 + i}" for i in range(1, self.nnodes + 1)]
        (ssh / "known_hosts").write_text("".join(f"{n} {pub[0]} {pub[1]}\n" for n in names))
        _run("chown", "-R", f"{self.user}:{self.user}", str(self.home))

    def _make_venv(self) -> None:
        ensure_venv()

    def _hosts_text(self, node: Node | None) -> str:
        lines = ["127.0.0.1 localhost"]
        me = node.name if node is not None else os.uname().nodename
        if self.hosts_style == "debian":
            lines.append(f"127.0.1.1 {me}")
        lines.append(f"{self.login_ip} {os.uname().nodename} wbmn0")
        lines += [f"{n.ip} {n.name}" for n in self.nodes]
        return "\n".join(lines) + "\n"

    def _make_network(self) -> None:
        self.nodes = [Node(i, f"wbmn{i}", f"{SUBNET}.{10 + i}") for i in range(1, self.nnodes + 1)]
        _run("ip", "link", "add", BRIDGE, "type", "bridge")
        # set, not inherited: a bridge takes its lowest port's MAC, so the login address's
        # MAC would change as nodes join and leave (see _link_node)
        _run("ip", "link", "set", BRIDGE, "address", f"{MAC_PREFIX}:00")
        _run("ip", "addr", "add", f"{self.login_ip}/24", "dev", BRIDGE)
        _run("ip", "link", "set", BRIDGE, "up")
        for node in self.nodes:
            self._link_node(node)
        self.login_hosts_file.write_text(self._hosts_text(None))

    def _link_node(self, node: Node) -> None:
        """The node's network namespace, joined to the bridge by a veth pair."""
        _run("ip", "netns", "add", node.name)
        veth = f"veth-{node.name}"
        _run("ip", "link", "add", veth, "type", "veth", "peer", "name", "eth0", "netns", node.name)
        _run("ip", "link", "set", veth, "master", BRIDGE, "up")
        # A fixed MAC per address: a node removed and added again (the spare tests' wbmn3)
        # must not get a new one, or its peers' ARP caches send to the old MAC, for up to
        # ~45 s of REACHABLE and then the probes, and a connect to it times out meanwhile
        mac = f"{MAC_PREFIX}:{node.index:02x}"
        _run("ip", "-n", node.name, "link", "set", "eth0", "address", mac)
        _run("ip", "-n", node.name, "addr", "add", f"{node.ip}/24", "dev", "eth0")
        _run("ip", "-n", node.name, "link", "set", "eth0", "up")
        _run("ip", "-n", node.name, "link", "set", "lo", "up")

    def _start_nodes(self) -> None:
        Path("/run/sshd").mkdir(mode=0o755, exist_ok=True)  # sshd's privilege-separation dir
        for node in self.nodes:
            self._start_node(node)

    def _start_node(self, node: Node) -> None:
        """The node's PID 1 (``node_init.py``) with its sshd (and slurmd) in fresh PID, mount
        and UTS namespaces joined to its network namespace."""
        d = self.root / node.name
        d.mkdir(exist_ok=True)  # a node brought back up (bring_up) keeps its directory
        (d / "hosts").write_text(self._hosts_text(node))
        (d / "sshd_config").write_text(
            f"ListenAddress {node.ip}\nPort 22\nHostKey {self.root}/ssh_host_ed25519_key\n"
            f"PidFile {d}/sshd.pid\nAuthorizedKeysFile .ssh/authorized_keys\n"
            "PubkeyAuthentication yes\nPasswordAuthentication no\n"
            "KbdInteractiveAuthentication no\nPermitRootLogin no\n"
            f"AllowUsers {self.user}\nUsePAM no\nUseDNS no\nPrintMotd no\nStrictModes no\n"
            "MaxStartups 200:30:400\nMaxSessions 200\nSubsystem sftp internal-sftp\n"
        )
        cfg = {
            "name": node.name,
            "pid_base": PID_BASE + node.index * PID_STEP,
            "hosts": str(d / "hosts"),
            "expose": EXPOSE,
            "stage": str(d / "stage"),
            "daemons": [["/usr/sbin/sshd", "-D", "-f", f"{d}/sshd_config", "-E", f"{d}/sshd.log"]]
            + (
                [["slurmd", "-D", "-N", node.name, "-f", str(self.slurm_conf)]]
                if self.slurm
                else []
            ),
        }
        # nsenter --net, not `ip netns exec`: the latter remounts /sys (slurmd needs
        # the real /sys/fs/cgroup). --kill-child: the node's init dies with unshare.
        with open(d / "init.log", "wb") as log:
            proc = subprocess.Popen(
                [
                    "nsenter",
                    f"--net=/run/netns/{node.name}",
                    "unshare",
                    "--pid",
                    "--mount-proc",
                    "--fork",
                    "--kill-child",
                    "--uts",
                    "--propagation",
                    "private",
                    sys.executable,
                    "-I",
                    str(NODE_INIT),
                    json.dumps(cfg),
                ],
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        node.unshare_pid = proc.pid
        self._save()

    def _wait_for_ssh(self, timeout: float = 60.0, nodes: list[Node] | None = None) -> None:
        deadline = time.monotonic() + timeout
        for node in self.nodes if nodes is None else nodes:
            while True:
                done = self.run_user(
                    ["ssh", "-o", "BatchMode=yes", "-o", "ConnectTimeout=3", node.name, "hostname"],
                    timeout=20,
                    check=False,
                )
                if done.returncode == 0 and done.stdout.strip() == node.name:
                    break
                if time.monotonic() > deadline:
                    log = (self.root / node.name / "init.log").read_text(errors="replace")
                    raise BedError(
                        f"node {node.name} did not answer ssh within {timeout}s: "
                        f"{done.stderr.strip()}\n{log[-2000:]}"
                    )
                time.sleep(0.3)

    def set_hosts_style(self, style: str) -> None:
        """Rewrite every ``/etc/hosts`` of the bed in place (the nodes see it at once)."""
        if style not in ("cluster", "debian"):
            raise BedError(f"hosts style {style!r}: use 'cluster' or 'debian'")
        self.hosts_style = style
        self.login_hosts_file.write_text(self._hosts_text(None))
        for node in self.nodes:
            # same inode: the node's bind mount of this file shows the new text
            with open(self.root / node.name / "hosts", "r+") as f:
                f.truncate(0)
                f.write(self._hosts_text(node))
        self._save()

    # ------------------------------------------------------------------ failures
    def node(self, name: str) -> Node:
        found = [n for n in self.nodes if n.name == name]
        if not found:
            raise BedError(f"no node {name!r}: the bed has {[n.name for n in self.nodes]}")
        return found[0]

    def cut_link(self, name: str) -> float:
        """Take the node's link down (its veth on the bridge): from here on nothing it
        sends arrives and nothing reaches it (no reset, no FIN): its peers' connections
        hang, as with a pulled cable. Returns the ``time.monotonic()`` of the cut."""
        _run("ip", "link", "set", f"veth-{self.node(name).name}", "down")
        return time.monotonic()

    def take_down(self, name: str) -> float:
        """The node goes down whole, as a powered-off host: its link is cut first (so no
        FIN or reset leaves it: peers see silence, not a closed connection), then every
        process in its namespaces is killed, sshd and slurmd included (SIGKILL to its
        PID-namespace init ends them all). Returns the ``time.monotonic()`` of the cut."""
        node = self.node(name)
        cut = self.cut_link(name)
        _stop_node(node)
        node.unshare_pid = 0
        self._save()
        return cut

    def fail_slurmd(self, name: str) -> float:
        """The node stays up (its sshd answers) but leaves Slurm's service: its slurmd and
        every process of the bed user there are killed (by pid) and slurmctld is told the
        node is DOWN, as it decides by itself SlurmdTimeout later. Returns the
        ``time.monotonic()`` of the kill."""
        node = self.node(name)
        ps = self.node_exec(node, ["ps", "-eo", "pid=,user=,comm="]).stdout
        rows = [line.split(None, 2) for line in ps.splitlines() if len(line.split()) == 3]
        pids = [pid for pid, user, comm in rows if comm == "slurmd" or user == self.user]
        self.node_exec(node, ["kill", "-KILL", *pids], check=False)
        killed = time.monotonic()
        env = {**os.environ, "SLURM_CONF": str(self.slurm_conf)}
        argv = ("scontrol", "update", f"NodeName={name}", "State=DOWN", "Reason=slurmd_killed")
        _run(*argv, env=env)
        return killed

    def bring_up(self, name: str, timeout: float = 60.0) -> None:
        """The node back (a host rebooted, or its cable plugged in again): its link up and,
        when it was taken down, its init with sshd (and slurmd) started afresh."""
        node = self.node(name)
        _run("ip", "link", "set", f"veth-{node.name}", "up")
        restart = not node.unshare_pid or not psutil.pid_exists(node.unshare_pid)
        if restart:
            self._start_node(node)
        self._wait_for_ssh(timeout, [node])
        if self.slurm and node.index <= len(self._slurm_nodes()):
            self._wait_for_slurm_node(node, timeout, resume=not restart)

    def _slurm_nodes(self) -> list[str]:
        text = self.slurm_conf.read_text()
        return [w.split("=", 1)[1] for w in text.split() if w.startswith("NodeName=")]

    def _wait_for_slurm_node(self, node: Node, timeout: float, resume: bool = False) -> None:
        """Until slurmctld has the node back in service (a node down longer than
        SlurmdTimeout is DOWN until its new slurmd registers; with ``resume``, one whose
        slurmd ran on through a cut link is resumed, as an admin would)."""
        env = {**os.environ, "SLURM_CONF": str(self.slurm_conf)}
        deadline = time.monotonic() + timeout
        while True:
            argv = ("sinfo", "-h", "-n", node.name, "-o", "%t")
            state = _run(*argv, check=False, env=env).stdout.strip()
            if state in ("idle", "mix", "alloc"):
                return
            if resume and state.startswith("down"):
                update = ("scontrol", "update", f"NodeName={node.name}", "State=RESUME")
                _run(*update, check=False, env=env)
            if time.monotonic() > deadline:
                raise BedError(f"slurm node {node.name} not back within {timeout}s: {state!r}")
            time.sleep(0.5)

    def add_node(self) -> Node:
        """One more node, ``wbmn<n+1>`` (e.g. a spare host for the run on the others): its
        network, sshd and host key entry; every ``/etc/hosts`` of the bed names it. With
        Slurm, also its slurmd, in service once it registers (one of the ``SLURM_SPARES``
        nodes the controller was configured with, DOWN until then)."""
        i = len(self.nodes) + 1
        node = Node(i, f"wbmn{i}", f"{SUBNET}.{10 + i}")
        self._link_node(node)
        self.nodes.append(node)
        self.nnodes = len(self.nodes)
        self._save()  # from here on, `down` removes it with the rest
        known = self.home / ".ssh" / "known_hosts"
        key = known.read_text().splitlines()[0].split()[1:]
        with open(known, "a") as f:
            f.write(f"{node.name},{node.ip} {key[0]} {key[1]}\n")
        self._start_node(node)
        self.set_hosts_style(self.hosts_style)  # the others' /etc/hosts name it too
        self._wait_for_ssh(60, [node])
        if self.slurm and node.name in self._slurm_nodes():
            self._wait_for_slurm_node(node, 60)
        return node

    def remove_node(self, name: str) -> None:
        """Undo ``add_node``: the node stopped, its namespace and link gone, unnamed."""
        node = self.node(name)
        if node.unshare_pid:
            _stop_node(node)
        if self.slurm and node.name in self._slurm_nodes():  # DOWN now, not at SlurmdTimeout
            env = {**os.environ, "SLURM_CONF": str(self.slurm_conf)}
            argv = ("scontrol", "update", f"NodeName={node.name}", "State=DOWN", "Reason=removed")
            _run(*argv, check=False, env=env)
        _run("ip", "link", "del", f"veth-{node.name}", check=False)  # first: see down()
        _run("ip", "netns", "del", node.name, check=False)
        self.nodes.remove(node)
        self.nnodes = len(self.nodes)
        shutil.rmtree(self.root / node.name, ignore_errors=True)
        self.set_hosts_style(self.hosts_style)
        self._save()

    # ------------------------------------------------------------------ slurm
    @property
    def slurm_conf(self) -> Path:
        return self.root / "slurm" / "slurm.conf"

    def _start_slurm_controller(self) -> None:
        """munged and slurmctld on the login node, in the foreground under our pids."""
        munge, slurm = self.root / "munge", self.root / "slurm"
        munge.mkdir(mode=0o700)
        (slurm / "state").mkdir(parents=True)
        key = munge / "munge.key"
        key.write_bytes(os.urandom(1024))
        key.chmod(0o400)
        spares = [
            Node(i, f"wbmn{i}", f"{SUBNET}.{10 + i}")
            for i in range(len(self.nodes) + 1, len(self.nodes) + 1 + SLURM_SPARES)
        ]
        for node in self.nodes + spares:
            (slurm / f"spool-{node.name}").mkdir()
        nodes = "\n".join(
            f"NodeName={n.name} NodeAddr={n.ip} CPUs=2 RealMemory=1000 "
            + ("State=DOWN Reason=not_added" if n in spares else "State=UNKNOWN")
            for n in self.nodes + spares
        )
        self.slurm_conf.write_text(
            f"ClusterName=wbmn\nSlurmctldHost={os.uname().nodename}({self.login_ip})\n"
            f"SlurmctldPort={SLURMCTLD_PORT}\nSlurmdPort={SLURMD_PORT}\nSlurmUser=root\n"
            f"AuthType=auth/munge\nAuthInfo=socket={munge}/munge.socket\nCredType=cred/munge\n"
            f"StateSaveLocation={slurm}/state\nSlurmdSpoolDir={slurm}/spool-%n\n"
            f"SlurmctldPidFile={slurm}/slurmctld.pid\nSlurmdPidFile={slurm}/slurmd-%n.pid\n"
            f"SlurmctldLogFile={slurm}/slurmctld.log\nSlurmdLogFile={slurm}/slurmd-%n.log\n"
            "ProctrackType=proctrack/linuxproc\nTaskPlugin=task/none\n"
            "JobAcctGatherType=jobacct_gather/none\nAccountingStorageType=accounting_storage/none\n"
            "SchedulerType=sched/backfill\nSelectType=select/cons_tres\n"
            "SelectTypeParameters=CR_CPU\nMpiDefault=none\nReturnToService=2\n"
            "SlurmctldTimeout=30\nSlurmdTimeout=30\nInactiveLimit=0\nKillWait=2\n"
            f"MinJobAge=5\nWaittime=0\n{nodes}\n"
            f"PartitionName=wb Nodes={','.join(n.name for n in self.nodes + spares)} Default=YES "
            "MaxTime=INFINITE State=UP\n"
        )
        self.slurm_conf.chmod(0o644)
        logs = open(self.root / "slurm" / "daemons.log", "wb")  # noqa: SIM115 (daemons keep it)
        munged = subprocess.Popen(
            [
                "munged",
                "-F",
                "--force",
                f"--socket={munge}/munge.socket",
                f"--key-file={key}",
                f"--pid-file={munge}/munged.pid",
                f"--log-file={munge}/munged.log",
                f"--seed-file={munge}/munged.seed",
            ],
            stdout=logs,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            start_new_session=True,
        )
        self.daemons.append(munged.pid)
        self._save()
        deadline = time.monotonic() + 20
        while not (munge / "munge.socket").exists():
            if time.monotonic() > deadline or munged.poll() is not None:
                raise BedError(f"munged did not start: {(munge / 'munged.log').read_text()}")
            time.sleep(0.1)
        munge.chmod(0o755)  # clients reach the socket; the key stays 0400 root
        ctld = subprocess.Popen(
            ["slurmctld", "-D", "-i", "-f", str(self.slurm_conf)],
            stdout=logs,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            start_new_session=True,
        )
        self.daemons.append(ctld.pid)
        self._save()

    def _wait_for_slurm(self, timeout: float = 60.0) -> None:
        deadline = time.monotonic() + timeout
        env = {**os.environ, "SLURM_CONF": str(self.slurm_conf)}
        names = {n.name for n in self.nodes}  # the spares stay DOWN until added
        while True:
            lines = _run("sinfo", "-h", "-N", "-o", "%N %t", check=False, env=env).stdout
            states = dict(line.split() for line in lines.splitlines() if len(line.split()) == 2)
            out = [states.get(name, "") for name in sorted(names)]
            if set(out) == {"idle"}:
                return
            if time.monotonic() > deadline:
                log = (self.root / "slurm" / "slurmctld.log").read_text(errors="replace")
                raise BedError(f"slurm nodes not idle within {timeout}s: {out}\n{log[-2000:]}")
            time.sleep(0.5)

    # ------------------------------------------------------------------ use
    def login_argv(self, argv: list[str]) -> list[str]:
        """``argv`` as the bed user on the login node, seeing the bed's ``/etc/hosts``."""
        cfg = {
            "hosts": str(self.login_hosts_file),
            "uid": self.uid,
            "gid": self.gid,
            "expose": EXPOSE,
            "stage": str(self.root / "login" / "stage"),
        }
        return [
            "unshare",
            "--mount",
            "--propagation",
            "private",
            sys.executable,
            "-I",
            str(NODE_INIT),
            "login",
            json.dumps(cfg),
            *argv,
        ]

    def run_user(
        self,
        argv: list[str],
        *,
        timeout: float,
        check: bool = True,
        env: dict[str, str] | None = None,
        cwd: str | None = None,
    ) -> subprocess.CompletedProcess[str]:
        """Run ``argv`` as the bed user on the login node (the "notebook" side)."""
        done = subprocess.run(
            self.login_argv(argv),
            env=self.user_env(env),
            cwd=cwd or str(self.home),
            text=True,
            capture_output=True,
            timeout=timeout,
            check=False,
        )
        if check and done.returncode != 0:
            raise BedError(f"{argv} failed ({done.returncode}): {done.stderr[-3000:]}")
        return done

    def drive(
        self, cfg: dict[str, object], timeout: float = 600, script: Path = DRIVER
    ) -> dict[str, Any]:
        """Run ``script`` (the notebook side: ``driver.py`` unless another driver of this
        directory is named) as the user on the login node; its report."""
        out = self.home / f"result-{time.monotonic_ns()}.json"
        done = self.run_user(
            [str(self.python), str(script), json.dumps(cfg), str(out)],
            timeout=timeout,
            check=False,
            cwd=str(DRIVER.parents[2]),
        )
        if not out.exists():
            raise BedError(f"the driver wrote no report (exit {done.returncode}):\n"
                           f"{done.stdout[-3000:]}\n{done.stderr[-6000:]}")  # fmt: skip
        report: dict[str, Any] = json.loads(out.read_text())
        out.unlink()
        report["stderr"] = done.stderr[-6000:]
        return report

    def spawn_driver(self, cfg: dict[str, object]) -> tuple[subprocess.Popen[str], Path]:
        """Start ``driver.py`` without waiting: the process (the driver itself: the login
        chain execs into it) and the path its report will appear at."""
        out = self.home / f"result-{time.monotonic_ns()}.json"
        with open(out.with_suffix(".log"), "w") as log:  # the driver's output, for failures
            proc = subprocess.Popen(
                self.login_argv([str(self.python), str(DRIVER), json.dumps(cfg), str(out)]),
                env=self.user_env(),
                cwd=str(DRIVER.parents[2]),
                text=True,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
            )
        return proc, out

    def node_exec(
        self, node: Node, argv: list[str], **kw: object
    ) -> subprocess.CompletedProcess[str]:
        """``argv`` as root inside every namespace of ``node``."""
        pid = node.init_pid()
        return _run("nsenter", "-t", str(pid), "-p", "-m", "-u", "-n", *argv, **kw)

    def node_processes(self, node: Node) -> list[str]:
        """The bed user's processes on ``node``, as ``pid args`` seen on that node."""
        out = self.node_exec(node, ["ps", "-u", self.user, "-o", "pid=,args="], check=False)
        return [line.strip() for line in out.stdout.splitlines() if line.strip()]

    def user_processes(self, exclude: set[int] = frozenset()) -> list[psutil.Process]:  # type: ignore[assignment]
        """Every process of the bed user on any node (seen from the root PID namespace)."""
        uid = self.uid
        found = []
        for proc in psutil.process_iter(["uids", "pid"]):
            uids = proc.info["uids"]
            if uids is not None and uids.real == uid and proc.pid not in exclude:
                found.append(proc)
        return found

    # ------------------------------------------------------------------ down
    def down(self) -> None:
        """Stop every node (by its init's pid), remove namespaces, bridge, user and files."""
        for node in self.nodes:
            if node.unshare_pid:
                _stop_node(node)
            # the veth first: a namespace lives on while sockets of its killed processes
            # still hold it (a node taken down with its link cut leaves orphaned TCP
            # sockets retrying for minutes), and its veth pair with it
            _run("ip", "link", "del", f"veth-{node.name}", check=False)
            _run("ip", "netns", "del", node.name, check=False)
        _run("ip", "link", "del", BRIDGE, check=False)
        for pid in reversed(self.daemons):  # slurmctld, then munged
            _stop_pid(pid)
        if self.created_user:
            try:
                leftovers = self.user_processes()
            except KeyError:
                leftovers = []
            for proc in leftovers:  # only this bed's own user: processes a test started
                try:
                    proc.kill()
                except psutil.Error:
                    continue
            psutil.wait_procs(leftovers, timeout=5)
            _run("userdel", self.user, check=False)
        shutil.rmtree(self.root, ignore_errors=True)
        STATE_FILE.unlink(missing_ok=True)


def _stop_pid(pid: int) -> None:
    try:
        proc = psutil.Process(pid)
        proc.terminate()
        proc.wait(10)
    except psutil.TimeoutExpired:
        proc.kill()
    except psutil.Error:
        return


def _stop_node(node: Node) -> None:
    """SIGKILL the node's PID 1: the kernel then ends every process of its PID namespace."""
    try:
        unshare = psutil.Process(node.unshare_pid)
    except psutil.Error:
        return
    with contextlib.suppress(BedError, psutil.Error, OSError):
        os.kill(node.init_pid(), signal.SIGKILL)
    try:
        unshare.wait(5)
    except psutil.TimeoutExpired:
        unshare.kill()  # --kill-child: its child (the node's init) goes too
        unshare.wait(5)


def main(argv: list[str]) -> int:
    cmd = argv[0] if argv else ""
    if cmd == "up":
        bed = Bed(
            hosts_style=os.environ.get("HOSTS_STYLE", "cluster"),
            slurm=os.environ.get("SLURM", "1") == "1",
        ).up()
        print(
            f"bed up in {bed.root}: user {bed.user}, nodes "
            + ", ".join(f"{n.name}={n.ip}" for n in bed.nodes)
        )
        print("run as the user: " + " ".join(bed.login_argv(["bash"])))
        return 0
    if cmd == "down":
        if STATE_FILE.exists():
            Bed.load().down()
        return 0
    if cmd == "status":
        bed = Bed.load()
        for node in bed.nodes:
            print(node.name, node.ip, bed.node_processes(node))
        return 0
    print("usage: python -m tests.multinode.bed up|down|status", file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
