"""Which host a process runs on, and which of its addresses the other hosts can reach.

Two questions the workbench must never answer by guessing:

- *Is this pid mine?* A pid means something only in its own PID namespace on its own
  machine. ``pid_space()`` names that space (the kernel's boot id plus the PID-namespace
  inode); an engine whose ``pid_space`` differs from the kernel's is remote, and its pid is
  never signalled or inspected locally.
- *Which address do the others reach me at?* Not the one the hostname resolves to: stock
  Debian/Ubuntu map the hostname to 127.0.1.1. The address of the interface that routes
  towards a peer (``route_source``) is reachable from that peer by construction; a named
  interface (``interface_address``) is the user's explicit choice.

Standard library and psutil only: these run on engines as well as in the kernel, so they
live in the engine package, which the kernel's cluster package sits above.
"""

from __future__ import annotations

import ipaddress
import os
import socket

import psutil

from workbench.errors import ClusterError, ConfigError

__all__ = [
    "interface_address",
    "interface_of",
    "is_loopback",
    "local_pid_space",
    "net_space",
    "pid_space",
    "resolve",
    "route_source",
    "use_interface",
]

_BOOT_ID = "/proc/sys/kernel/random/boot_id"


def pid_space() -> str:
    """An id shared by exactly the processes that can signal each other's pids."""
    return _namespace_id("pid")


def net_space() -> str | None:
    """An id shared by exactly the processes whose 127.0.0.1 is the same (one machine, one
    network namespace); None where that cannot be told (not Linux)."""
    ident = _namespace_id("net")
    return None if ident.endswith("/0") else ident


def _namespace_id(kind: str) -> str:
    try:
        with open(_BOOT_ID) as f:
            boot = f.read().strip()
    except OSError:  # not Linux: the hostname is the best available machine identity
        boot = socket.gethostname()
    try:
        ns = os.stat(f"/proc/self/ns/{kind}").st_ino
    except OSError:
        ns = 0
    return f"{boot}/{ns}"


_LOCAL: list[str] = []


def local_pid_space() -> str:
    """``pid_space()`` of this process (cached: it cannot change while we run)."""
    if not _LOCAL:
        _LOCAL.append(pid_space())
    return _LOCAL[0]


def is_loopback(address: str) -> bool:
    try:
        return ipaddress.ip_address(address).is_loopback
    except ValueError:
        return False


def resolve(host: str) -> str:
    """The IPv4 address of ``host`` (``user@host`` and ``host:port`` accepted)."""
    name = host.rsplit("@", 1)[-1].split(":", 1)[0]
    try:
        return socket.getaddrinfo(name, None, socket.AF_INET)[0][4][0]  # type: ignore[no-any-return]
    except OSError as exc:
        raise ClusterError(f"host {name!r} does not resolve on this machine: {exc}") from exc


def route_source(target: str) -> str:
    """This host's address on the interface that routes to ``target``.

    Connecting a UDP socket sends nothing; it only asks the kernel's routing table which
    source address a packet to ``target`` would carry.
    """
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        try:
            s.connect((target, 9))
        except OSError as exc:
            raise ClusterError(f"no route from {socket.gethostname()} to {target}: {exc}") from exc
        return s.getsockname()[0]  # type: ignore[no-any-return]


def _ipv4_by_interface() -> dict[str, str]:
    return {
        name: a.address
        for name, addrs in psutil.net_if_addrs().items()
        for a in addrs
        if a.family == socket.AF_INET
    }


def interface_address(name: str) -> str:
    """The IPv4 address of network interface ``name`` on this host."""
    found = _ipv4_by_interface()
    if name not in found:
        raise ConfigError(
            f"network_interface={name!r} has no IPv4 address on {socket.gethostname()}; "
            f"interfaces there: {sorted(found)}"
        )
    return found[name]


def interface_of(address: str) -> str | None:
    """The interface that holds ``address`` on this host, if any."""
    for name, addr in _ipv4_by_interface().items():
        if addr == address:
            return name
    return None


def use_interface(address: str) -> str | None:
    """Make gloo and NCCL use the interface holding ``address`` (unless the user chose one).

    Without this, gloo picks the address the hostname resolves to (127.0.1.1 on Debian),
    which peers on other hosts cannot reach. Returns the interface name.
    """
    name = interface_of(address)
    if name is not None:
        os.environ.setdefault("GLOO_SOCKET_IFNAME", name)
        os.environ.setdefault("NCCL_SOCKET_IFNAME", name)
    return name
