"""``cluster.doctor()`` and ``cluster.measured_hardware()``: is every host the same, and is
the network what a plan assumes?

``doctor("env")`` asks every rank for its environment again (``engine/doctor_env.py``) and
compares hosts; ``doctor("net")`` measures every pair of ranks and an all-reduce sweep per
group (``doctor_net.py``); ``doctor()`` does both. ``measured_hardware()`` turns the last
network measurement (made on demand) into the planner's ``HardwareSpec``.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from workbench import validate
from workbench.cluster.doctor.doctor_env import (
    EnvironmentReport,
    check_package_names,
    environment_report,
)
from workbench.cluster.doctor.doctor_net import NetOptions, NetworkReport, measure_network
from workbench.engine.doctor_env import environment_facts

if TYPE_CHECKING:
    from workbench.cluster.ranks import RankAssignment
    from workbench.planner.specs import HardwareSpec

__all__ = ["CHECKS", "ClusterDoctor", "DoctorReport"]

CHECKS = ("all", "env", "net")


@dataclass(slots=True)
class DoctorReport:
    """Both checks of ``cluster.doctor()``; each shows itself in a notebook."""

    environment: EnvironmentReport
    network: NetworkReport

    def __repr__(self) -> str:
        return f"{self.environment!r}\n{self.network!r}"

    def _repr_html_(self) -> str:
        return self.environment._repr_html_() + self.network._repr_html_()


class ClusterDoctor:
    """Mixed into ``Cluster``: the doctor's entry points."""

    ranks: list[RankAssignment]
    check_packages: tuple[str, ...]
    network: NetworkReport | None

    def run(self, fn: Any, *args: Any, **kwargs: Any) -> list[Any]:  # implemented by Cluster
        raise NotImplementedError

    @property
    def client(self) -> Any:  # implemented by Cluster: raises unless running
        raise NotImplementedError

    def doctor(
        self,
        check: str = "all",
        *,
        check_packages: Sequence[str] | str | None = None,
        **net_options: Any,
    ) -> EnvironmentReport | NetworkReport | DoctorReport:
        """``"env"``: every host's versions and variables, differences highlighted;
        ``"net"``: latency and bandwidth of every pair of ranks, all-reduce bus bandwidth
        per group, slow links flagged (options: see ``NetOptions``); ``"all"``: both."""
        check = validate.choice("check", check, CHECKS)
        packages = (
            self.check_packages
            if check_packages is None
            else check_package_names("check_packages", check_packages)
        )
        if check == "env" and net_options:
            raise validate.invalid(
                "option",
                sorted(net_options)[0],
                "doctor('env') takes no network options",
                "check_packages= only, or doctor('net', ...)",
            )
        options = NetOptions.checked(**net_options)  # every input checked before any work
        if self.client is None:  # the property raises when the cluster is not running
            raise RuntimeError("no client")
        env = self._environment(packages) if check in ("all", "env") else None
        if check == "env" and env is not None:
            return env
        net = self.network = measure_network(self, options)  # type: ignore[arg-type]
        if env is None:
            return net
        return DoctorReport(environment=env, network=net)

    def _environment(self, packages: Sequence[str]) -> EnvironmentReport:
        facts = self.run(environment_facts, list(packages))
        labelled = [(r.host, r.engine_id, f) for r, f in zip(self.ranks, facts, strict=True)]
        return environment_report(labelled, packages)

    def measured_hardware(self, base: HardwareSpec | None = None) -> HardwareSpec:
        """The planner's ``HardwareSpec`` with this cluster's measured links: ``base`` (a
        preset such as ``wb.planner.presets``' GPUs) or, without it, a CPU profile of this
        host, as ``workbench calibrate`` makes. Measures the network first if
        ``doctor("net")`` has not run."""
        from workbench.planner.network_fit import measured_hardware
        from workbench.planner.specs import HardwareSpec

        if base is not None and not isinstance(base, HardwareSpec):
            raise validate.invalid(
                "base", base, "it is not a HardwareSpec", "a planner HardwareSpec or None"
            )
        if self.network is None:
            self.doctor("net")
        report = self.network
        if report is None:  # doctor("net") always sets it
            raise RuntimeError("no network measurement")
        per_host: dict[str, int] = {}
        for host in report.hosts:
            per_host[host] = per_host.get(host, 0) + 1
        return measured_hardware(report.fits, ranks_per_node=max(per_host.values()), base=base)
