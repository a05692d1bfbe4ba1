"""``cluster.doctor`` and ``%wb doctor`` on the shared 2-rank gloo cluster."""

from __future__ import annotations

import textwrap
from importlib import metadata
from typing import Any

import pytest
from IPython.core.error import UsageError

import workbench as wb
from workbench.cluster import Cluster
from workbench.cluster.doctor.cluster_doctor import DoctorReport
from workbench.cluster.doctor.doctor_env import EnvironmentReport
from workbench.cluster.doctor.doctor_net import NetworkReport
from workbench.errors import ConfigError
from workbench.planner import hardware_preset
from workbench.plots.network import network_figure
from workbench.session.traced_log import TraceLog
from workbench.trace import straggler_summary

pytestmark = pytest.mark.engines

QUICK = {"iters": 30, "bandwidth_bytes": 1 << 18, "bandwidth_iters": 2, "sweep_iters": 2}


def test_the_start_compared_the_engines_environments(cluster: Cluster) -> None:
    report = cluster.environment
    assert isinstance(report, EnvironmentReport)
    assert list(report.rows) == [cluster.ranks[0].host]  # one host, engines alike
    assert report.errors == [] and report.differences() == {}
    row = report.rows[cluster.ranks[0].host]
    assert row["workbench"] == metadata.version("distributed-workbench")


def test_doctor_env_asks_again_with_the_packages_named(cluster: Cluster) -> None:
    report = cluster.doctor("env", check_packages=["pytest"])
    assert isinstance(report, EnvironmentReport)
    (row,) = report.rows.values()
    assert row["pytest"] == metadata.version("pytest")


def test_doctor_net_measures_the_pair_and_fits_the_link_the_planner_takes(
    cluster: Cluster,
) -> None:
    report = cluster.doctor("net", **QUICK)
    assert isinstance(report, NetworkReport)
    (pair,) = report.pairs
    assert (pair.a, pair.b, pair.same_host) == (0, 1, True)
    assert 0 < pair.latency <= pair.latency_p99 and pair.one_way > 0 and pair.both_ways > 0
    assert report.slowest == pair and report.slow == []
    (label,) = report.fits
    assert label == f"intra {cluster.ranks[0].host}"
    hw = cluster.measured_hardware()
    assert hw.intra.bandwidth == report.fits[label].bandwidth
    assert hw.inter.bandwidth == hw.intra.bandwidth  # one host: nothing else to measure
    assert wb.plan(model="gpt2-small", gpus=2, hardware=hw).time.dp_comm > 0
    on_gpu = cluster.measured_hardware(base=hardware_preset("h100-80gb"))
    assert on_gpu.intra.bandwidth == hw.intra.bandwidth and on_gpu.peak_flops > hw.peak_flops
    assert network_figure(report).data[0].z[0][1] == pytest.approx(pair.one_way / 1e9)


@pytest.mark.parametrize(
    ("args", "kwargs", "message"),
    [
        (("nett",), {}, r"check='nett' is not valid.*'all', 'env', 'net'"),
        (("net",), {"iters": 0}, r"iters=0 is not valid"),
        (("net",), {"sweep_sizes": [64, 64]}, r"sweep_sizes=\[64, 64\] is not valid"),
        (("net",), {"bogus": 1}, r"option='bogus' is not valid"),
        (("env",), {"iters": 5}, r"network options"),
        (("env",), {"check_packages": ["a b"]}, r"check_packages='a b' is not valid"),
    ],
)
def test_bad_doctor_input_fails_before_any_work(
    cluster: Cluster, args: tuple[Any, ...], kwargs: dict[str, Any], message: str
) -> None:
    before = cluster.network
    with pytest.raises(ConfigError, match=message):
        cluster.doctor(*args, **kwargs)
    assert cluster.network is before


def test_a_bad_package_name_fails_before_any_process_starts() -> None:
    with pytest.raises(ConfigError, match=r"check_packages='no way' is not valid"):
        Cluster(n=2, check_packages=["no way"])


def test_percent_wb_doctor_shows_both_and_returns_the_heatmap(
    ipython_shell: Any, cluster: Cluster
) -> None:
    shown: list[Any] = []
    from unittest import mock

    with mock.patch("IPython.display.display", side_effect=shown.append):
        fig = ipython_shell.run_line_magic(
            "wb", "doctor --iters 20 --bandwidth-iters 2 --bytes 65536"
        )
    (report,) = shown
    assert isinstance(report, DoctorReport) and fig.data[0].type == "heatmap"
    assert isinstance(ipython_shell.run_line_magic("wb", "doctor env"), EnvironmentReport)
    with pytest.raises(UsageError, match="--iters"):
        ipython_shell.run_line_magic("wb", "doctor net --iters 0")
    with pytest.raises(UsageError, match="doctor net"):
        ipython_shell.run_line_magic("wb", "doctor env --iters 5")


def test_a_rank_slowed_in_forward_is_named_and_its_peer_waits(cluster: Cluster) -> None:
    log = TraceLog(cluster)
    log.pull()  # what earlier tests traced is not this loop's
    code = textwrap.dedent(
        """
        import time
        model = torch.nn.parallel.DistributedDataParallel(torch.nn.Linear(8, 1))
        optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
        x, y = torch.randn(16, 8), torch.randn(16, 1)
        with wb.traced(model, optimizer, seed=0) as t:
            for _ in range(4):
                with t.phase("forward"):
                    loss = torch.nn.functional.mse_loss(model(x), y)
                    time.sleep(0.2 if rank == 1 else 0.0)
                with t.phase("backward"):
                    loss.backward()
                optimizer.step(); optimizer.zero_grad(); t.step(loss=loss)
        """
    )
    results = cluster.execute(code, timeout=120)
    assert all(r.ename is None for r in results), results
    report = straggler_summary(log.pull())
    assert report.slowest == 1 and report.phase == "forward"
    assert report.excess_s > 0.1  # 0.2 s of sleep per step, less scheduling noise
    assert report.wait_s[0] > 0.1 and report.wait_s.get(1, 0.0) < report.wait_s[0]


def test_a_rank_outside_a_sweep_group_takes_part_in_its_creation_only(cluster: Cluster) -> None:
    from workbench.engine.doctor_net import probe_network

    results = cluster.run(
        probe_network,
        [],
        {"first only": [0], "world": [0, 1]},
        iters=2,
        bandwidth_bytes=64,
        bandwidth_iters=1,
        sweep_sizes=[64, 256],
        sweep_iters=1,
        timeout=120,
    )
    assert sorted(results[0]["sweeps"]) == ["first only", "world"]
    assert sorted(results[1]["sweeps"]) == ["world"]
    assert [len(rows) for rows in results[0]["sweeps"].values()] == [2, 2]
    after = cluster.execute("t = torch.ones(1); dist.all_reduce(t); print(t.item())", timeout=60)
    assert [r.ename for r in after] == [None, None]  # the world group still works afterwards


def test_the_steppers_events_give_per_rank_step_and_phase_times(cluster: Cluster) -> None:
    from workbench.ui.stepper import Stepper

    stepper = Stepper(model="mlp-tiny", strategy="dp", batch_size=8, cluster=cluster)
    try:
        stepper.step(3)
        events = stepper.events
    finally:
        stepper.close()
    report = straggler_summary(events)
    assert sorted(report.step_s) == [0, 1] and all(t > 0 for t in report.step_s.values())
    for rank in (0, 1):
        assert {"forward", "backward", "optimizer"} <= set(report.phase_s[rank])
    assert report.slowest in (0, 1) and report.phase in report.phase_s[report.slowest]
    assert set(report.wait_s) == {0, 1}  # DDP's all-reduces matched across the two ranks
    assert "slowest rank" in report.summary()
