"""Launcher options, address choice, local ranks and pid ownership: no processes needed."""

from __future__ import annotations

import asyncio
import os
import signal
import sys
from dataclasses import replace
from pathlib import Path
from types import SimpleNamespace

import pytest

from workbench.cluster import Cluster
from workbench.cluster.hosts import rendezvous
from workbench.cluster.launch import launchers
from workbench.cluster.lifecycle import signals
from workbench.cluster.loop import run_anywhere
from workbench.cluster.ranks import EngineInfo, assign_ranks, relocalize
from workbench.cluster.world import World
from workbench.engine import hosts
from workbench.errors import ClusterError, ConfigError

REMOTE = "some-other-boot-id/4026531836"  # a pid space that is not this process's


def test_unknown_option_names_the_launcher_and_its_options() -> None:
    with pytest.raises(ConfigError) as info:
        Cluster(n=2, launcher="ssh", hosts=["a"], launcher_options={"remote_pyhton": "x"})
    message = str(info.value)
    assert "remote_pyhton" in message and "remote_python" in message and "ssh_args" in message
    with pytest.raises(ConfigError, match="none"):
        Cluster(n=2, launcher_options={"ssh_args": ["-v"]})  # local takes no options


@pytest.mark.parametrize(
    ("options", "fragment"),
    [
        ({"ssh_args": "-p 22"}, "list of strings"),
        ({"ssh_args": ["-p", 22]}, "every item"),
        ({"remote_python": ""}, "non-empty str"),
        ({"remote_python": 3}, "non-empty str"),
        ({"status_dir": "/no/such/dir"}, "not a directory"),
    ],
)
def test_bad_option_values_are_refused(options: dict[str, object], fragment: str) -> None:
    with pytest.raises(ConfigError, match=fragment):
        launchers.parse_options("ssh", options)


def test_ssh_defaults_run_the_kernels_interpreter_without_prompts(tmp_path: Path) -> None:
    options = launchers.parse_options("ssh", {"ssh_args": ["-p", "2222"]})
    settings = launchers.ipp_settings("ssh", 5, ["a", "b"], options, "10.0.0.1", str(tmp_path))
    cfg = settings["config"]
    assert cfg.SSHLauncher.remote_python == sys.executable
    args = cfg.SSHLauncher.ssh_args
    assert "BatchMode=yes" in args and f"ControlPath={tmp_path}/ssh-%C" in args
    assert args[-2:] == ["-p", "2222"]  # the user's own options come last and win
    assert cfg.SSHEngineSetLauncher.engines == {"a": 3, "b": 2}
    assert settings["controller_ip"] == settings["controller_location"] == "10.0.0.1"
    local = launchers.ipp_settings("local", 2, [], launchers.LauncherOptions(), None)
    assert local["controller_ip"] == "127.0.0.1"


def test_a_loopback_interface_for_remote_hosts_is_refused() -> None:
    options = launchers.parse_options("ssh", {"network_interface": "lo"})
    with pytest.raises(ConfigError, match=r"loopback address 127\.0\.0\.1"):
        launchers.controller_address("ssh", ["node1"], options)


def test_addresses_come_from_interfaces_and_routes() -> None:
    assert hosts.interface_address("lo") == "127.0.0.1"
    with pytest.raises(ConfigError, match="interfaces there"):
        hosts.interface_address("no-such-if0")
    assert hosts.route_source("127.0.0.1") == "127.0.0.1"
    assert hosts.is_loopback("127.0.1.1") and not hosts.is_loopback("10.1.2.3")
    assert hosts.pid_space() == hosts.local_pid_space()


def _ranks(n_per_host: dict[str, int]) -> list:
    engines, eid = [], 0
    for host, n in n_per_host.items():
        for _ in range(n):
            engines.append(
                EngineInfo(engine_id=eid, host=host, pid=100 + eid, address=f"10.0.0.{eid}")
            )
            eid += 1
    return assign_ranks(engines, backend="gloo")


def test_loopback_master_addr_across_hosts_names_the_address_and_the_fix() -> None:
    ranks = [replace(r, master_addr="127.0.1.1") for r in _ranks({"n1": 2, "n2": 2})]
    with pytest.raises(ClusterError) as info:
        asyncio.run(rendezvous.check_reachable(None, ranks))
    message = str(info.value)
    assert "127.0.1.1" in message and "n2" in message and "network_interface" in message
    assert "/etc/hosts" in message


def test_relocalize_recomputes_local_ranks_after_a_move() -> None:
    ranks = _ranks({"n1": 2, "n2": 2})
    assert [(r.local_rank, r.node_rank) for r in ranks] == [(0, 0), (1, 0), (0, 1), (1, 1)]
    moved = [replace(r, host="n2") if r.rank == 1 else r for r in ranks]
    again = relocalize(moved)
    assert [r.rank for r in again] == [0, 1, 2, 3]
    assert [(r.host, r.local_rank, r.local_world_size) for r in again] == [
        ("n1", 0, 1),
        ("n2", 0, 3),
        ("n2", 1, 3),
        ("n2", 2, 3),
    ]
    assert {r.num_nodes for r in again} == {2}


def test_a_remote_pid_is_never_used_locally(monkeypatch: pytest.MonkeyPatch) -> None:
    cluster = Cluster(n=2, launcher="ssh", hosts=["n1"])
    me = os.getpid()
    cluster._set_world(
        World(tuple([replace(r, pid=me, pid_space=REMOTE) for r in _ranks({"n1": 2})]))
    )
    cluster.engines._ipp = SimpleNamespace(
        controller=None, engines={}
    )  # started, as far as pids go
    assert me not in cluster.pids()
    assert me not in [p.pid for p in cluster.engines.process_tree(cluster.ranks)]
    assert cluster.status_dir_of(cluster.ranks[0]) is None  # its /tmp is not ours

    killed: list[int] = []
    monkeypatch.setattr(os, "kill", lambda pid, sig: killed.append(pid))

    class NoNanny:
        def send_signal(self, *args: object, **kwargs: object) -> None:
            raise RuntimeError("engine gone")

    assert not run_anywhere(signals.signal_rank(NoNanny(), cluster.ranks[0], signal.SIGINT))
    assert killed == []  # not even as a fallback
    local = replace(cluster.ranks[0], pid_space=hosts.local_pid_space())
    assert run_anywhere(signals.signal_rank(NoNanny(), local, signal.SIGINT))
    assert killed == [me]


def test_a_shared_status_dir_reaches_remote_ranks(tmp_path: Path) -> None:
    cluster = Cluster(
        n=2, launcher="ssh", hosts=["n1"], launcher_options={"status_dir": str(tmp_path)}
    )
    cluster.engines._run_dir = str(tmp_path / "wb-run-x")
    remote = replace(_ranks({"n1": 2})[0], pid_space=REMOTE)
    assert cluster.status_dir_of(remote) == cluster.run_dir  # hang reports see it


def test_wb_start_passes_launcher_options() -> None:
    from IPython.core.error import UsageError

    from workbench.magics.args import MagicParser
    from workbench.magics.cluster_cmds import _start_args, make_cluster

    parser = MagicParser(prog="%wb start")
    _start_args(parser)
    line = ["--launcher", "ssh", "--hosts", "a,b", "--remote-python", "/x/python"]
    cluster = make_cluster(parser.parse([*line, "--ssh-args", "-p 2222"]))
    assert cluster.launcher_options.remote_python == "/x/python"
    assert cluster.launcher_options.ssh_args == ("-p", "2222")
    with pytest.raises(UsageError, match="ssh-args"):
        make_cluster(parser.parse([*line, "--ssh-args", "-o 'unclosed"]))
    with pytest.raises(UsageError, match="partition"):  # a slurm option for ssh
        make_cluster(parser.parse([*line, "--partition", "gpu"]))


def test_controller_address_for_this_machine_only_is_loopback() -> None:
    options = launchers.LauncherOptions()
    assert launchers.controller_address("ssh", ["localhost"], options) == "127.0.0.1"
    assert launchers.controller_address("slurm", [], options) is None  # Slurm picks nodes
