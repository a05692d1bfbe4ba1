"""Faults the cluster doctor must see on the 2-node bed (root only), each undone on exit.

- ``throttled(bed, node, mbit)``: a token bucket (``tc ... tbf``) on both ends of the
  node's link, so traffic into the node (the bridge side, ``veth-wbmnI``) and out of it
  (the node's ``eth0``) both run at the configured rate.
- ``cpu_quota(bed, share)``: a cgroup v1 CPU group that lets its processes use ``share``
  of one core; its ``cgroup.procs`` belongs to the bed user, so an engine (running as that
  user) can move itself in by writing ``0`` there.
- ``node_packages(bed, {node: version})``: a tiny distribution ``wbmn-probe`` at a
  different version in each node's own ``/tmp``, and an interpreter wrapper there that
  puts it on ``PYTHONPATH`` (pass ``PROBE_PYTHON`` as ``remote_python``): one node's
  environment then differs from the others' in a package the user checks.
"""

from __future__ import annotations

import contextlib
import os
import subprocess
from collections.abc import Iterator, Mapping
from pathlib import Path

from tests.multinode.bed import Bed, Node

__all__ = ["CGROUP_CPU", "PROBE_PACKAGE", "PROBE_PYTHON", "cpu_quota", "node_packages", "throttled"]

CGROUP_CPU = Path("/sys/fs/cgroup/cpu")
PROBE_PACKAGE = "wbmn-probe"
PROBE_DIR = "/tmp/wbmn-doctor"  # each node's /tmp is its own
PROBE_PYTHON = f"{PROBE_DIR}/python"


def _tc(*argv: str) -> None:
    subprocess.run(["tc", *argv], check=True, capture_output=True, text=True)


def _tbf(mbit: int) -> list[str]:
    # burst: 5 ms at the rate (well above rate/HZ, so the bucket does not cap it lower);
    # latency: a queue deep enough that TCP is slowed by waiting, not by drops
    burst = max(mbit * 1_000_000 // 8 // 200, 64 * 1024)
    return ["tbf", "rate", f"{mbit}mbit", "burst", str(burst), "latency", "200ms"]


@contextlib.contextmanager
def throttled(bed: Bed, node: Node, mbit: int) -> Iterator[None]:
    """``node``'s link limited to ``mbit`` Mbit/s each way while the block runs."""
    outside = ["dev", f"veth-{node.name}", "root"]
    inside = ["-n", node.name, "qdisc"]
    try:
        _tc("qdisc", "add", *outside, *_tbf(mbit))
        _tc(*inside, "add", "dev", "eth0", "root", *_tbf(mbit))
        yield
    finally:
        subprocess.run(["tc", "qdisc", "del", *outside], capture_output=True)
        subprocess.run(["tc", *inside, "del", "dev", "eth0", "root"], capture_output=True)


def qdiscs(node: Node) -> str:
    """Both ends' root qdiscs (what a test checks is gone afterwards)."""
    out = subprocess.run(
        ["tc", "qdisc", "show", "dev", f"veth-{node.name}"], capture_output=True, text=True
    ).stdout
    out += subprocess.run(
        ["tc", "-n", node.name, "qdisc", "show", "dev", "eth0"], capture_output=True, text=True
    ).stdout
    return out


@contextlib.contextmanager
def cpu_quota(bed: Bed, share: float) -> Iterator[Path]:
    """A CPU cgroup capped at ``share`` of one core that the bed user may join; on exit
    whatever is still in it goes back to the root group and the group is removed."""
    group = CGROUP_CPU / f"wbmn-slow-{os.getpid()}"
    group.mkdir()
    try:
        period = int((group / "cpu.cfs_period_us").read_text())
        (group / "cpu.cfs_quota_us").write_text(str(max(1000, int(period * share))))
        for name in ("cgroup.procs", "tasks"):
            os.chown(group / name, bed.uid, bed.gid)
        yield group
    finally:
        for pid in (group / "cgroup.procs").read_text().split():
            with contextlib.suppress(OSError):  # it may have ended meanwhile
                (CGROUP_CPU / "cgroup.procs").write_text(pid)
        group.rmdir()


@contextlib.contextmanager
def node_packages(bed: Bed, versions: Mapping[str, str]) -> Iterator[None]:
    """``wbmn-probe`` at ``versions[node name]`` on each node, seen by ``PROBE_PYTHON``."""
    try:
        for node in bed.nodes:
            version = versions[node.name]
            info = f"{PROBE_DIR}/site/wbmn_probe-{version}.dist-info"
            script = (
                f"mkdir -p {info} && "
                f"printf 'Metadata-Version: 2.1\\nName: {PROBE_PACKAGE}\\nVersion: {version}\\n'"
                f" > {info}/METADATA && "
                f"printf '#!/bin/sh\\nPYTHONPATH={PROBE_DIR}/site exec {bed.python} \"$@\"\\n'"
                f" > {PROBE_PYTHON} && chmod -R a+rX {PROBE_DIR} && chmod a+x {PROBE_PYTHON}"
            )
            bed.node_exec(node, ["sh", "-c", script])
        yield
    finally:
        for node in bed.nodes:
            bed.node_exec(node, ["rm", "-rf", PROBE_DIR], check=False)
