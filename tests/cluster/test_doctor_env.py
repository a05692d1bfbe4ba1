"""The doctor's environment facts (gathered in this process) and their comparison."""

from __future__ import annotations

import platform
from importlib import metadata
from typing import Any

import pytest
import torch

from workbench.cluster.doctor.doctor_env import (
    check_package_names,
    environment_report,
    refuse_mismatch,
)
from workbench.cluster.world import World
from workbench.engine.doctor_env import environment_facts
from workbench.errors import ClusterError, ConfigError


def test_facts_are_this_process_versions_and_collective_variables(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("NCCL_DEBUG", "INFO")
    monkeypatch.setenv("GLOO_SOCKET_IFNAME", "lo")
    monkeypatch.setenv("WB_UNRELATED", "1")
    facts = environment_facts(["pytest", "no-such-package-here"])
    assert facts["python"] == platform.python_version()
    assert facts["torch"] == torch.__version__ and facts["cuda"] == torch.version.cuda
    assert facts["torch_git"] == torch.version.git_version
    assert facts["packages"]["pytest"] == metadata.version("pytest")
    assert facts["packages"]["workbench"] == metadata.version("distributed-workbench")
    assert facts["packages"]["no-such-package-here"] is None
    assert facts["env"]["NCCL_DEBUG"] == "INFO" and facts["env"]["GLOO_SOCKET_IFNAME"] == "lo"
    assert "WB_UNRELATED" not in facts["env"]
    if not torch.cuda.is_available():  # NCCL and cuDNN only where CUDA really is
        assert facts["nccl"] is None and facts["cudnn"] is None


def _with(**changes: Any) -> dict[str, Any]:
    facts = environment_facts(["pytest"])
    for key, value in changes.items():
        if key in facts["packages"]:
            facts["packages"] = {**facts["packages"], key: value}
        else:
            facts[key] = value
    return facts


def test_a_torch_difference_fails_naming_both_hosts_and_versions() -> None:
    report = environment_report(
        [("node-a", 0, _with()), ("node-b", 1, _with(torch="2.0.0"))], ("pytest",)
    )
    with pytest.raises(ClusterError) as err:
        refuse_mismatch(report)
    text = str(err.value)
    assert "torch differs" in text and "node-b has 2.0.0" in text
    assert f"node-a has {torch.__version__}" in text


@pytest.mark.parametrize(
    ("change", "field"),
    [
        ({"nccl": "2.18.1"}, "nccl"),
        ({"cuda": "12.1"}, "cuda"),
        ({"workbench": "0.0.1"}, "workbench"),
        ({"python": "3.10.4"}, "python minor"),
        ({"pytest": "1.0"}, "pytest"),  # a package the user named
    ],
)
def test_breaking_differences_are_errors(change: dict[str, Any], field: str) -> None:
    report = environment_report([("a", 0, _with()), ("b", 1, _with(**change))], ("pytest",))
    assert [e.split(" differs")[0] for e in report.errors] == [field]


def test_other_differences_are_warnings_and_hosts_own_facts_are_only_shown() -> None:
    same = _with()
    other = _with(numpy="1.0.0", env={**same["env"], "NCCL_IB_DISABLE": "1"}, cpus=64)
    other["python"] = same["python"].rsplit(".", 1)[0] + ".99"
    report = environment_report([("a", 0, same), ("b", 1, other)])
    refuse_mismatch(report)  # nothing breaking
    assert report.errors == []
    warned = {w.split(" differs")[0] for w in report.warnings}
    assert warned == {"numpy", "$NCCL_IB_DISABLE", "python"}
    assert "cpus" in report.differences()  # shown, highlighted, not warned about
    page = report._repr_html_()
    assert page.count("background:#fdd") == 2 * len(report.differences())
    # a row per field, a column per host (fits a projector), the git hash shortened
    assert "<tr><th>field</th><th>a</th><th>b</th></tr>" in page
    assert page.count("<tr>") == 1 + len(report.columns)
    git = str(same["torch_git"])  # torch's 40-character commit hash
    assert f">{git[:12]}…</td>" in page and f'title="{git}"' in page


def test_engines_of_one_host_share_a_row_unless_they_differ() -> None:
    same = environment_report([("a", 0, _with()), ("a", 1, _with())])
    assert list(same.rows) == ["a"]
    split = environment_report([("a", 0, _with()), ("a", 1, _with(numpy="0.1"))])
    assert list(split.rows) == ["a (engine 0)", "a (engine 1)"]


def test_package_names_are_checked_in_the_project_style() -> None:
    assert check_package_names("check_packages", "peft, accelerate") == ("peft", "accelerate")
    assert check_package_names("check_packages", ["peft"]) == ("peft",)
    with pytest.raises(ConfigError, match=r"check_packages='pe ft' is not valid: .*package"):
        check_package_names("check_packages", ["pe ft"])
    with pytest.raises(ConfigError, match=r"check_packages=3 is not valid"):
        check_package_names("check_packages", 3)


def test_the_start_refuses_before_any_store_or_group_exists(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """init_process_group compares the engines' facts before rank 0 opens its store."""
    import asyncio
    from types import SimpleNamespace

    from workbench.cluster.lifecycle import start_sequence
    from workbench.cluster.lifecycle.startup import StartupProfile

    infos = [
        {"host": host, "pid": 10 + i, "address": "127.0.0.1", "cuda_devices": 0, "cpus": 1,
         "environment": facts}
        for i, (host, facts) in enumerate([("node-a", _with()), ("node-b", _with(nccl="2.1"))])
    ]  # fmt: skip

    async def engine_infos(*args: Any) -> tuple[list[int], list[dict[str, Any]]]:
        return [0, 1], infos

    opened: list[object] = []

    async def open_store(*args: object) -> int:
        opened.append(args)
        return 1

    monkeypatch.setattr(start_sequence, "engine_infos", engine_infos)
    monkeypatch.setattr(start_sequence, "open_store", open_store)
    engines = SimpleNamespace(
        client_unchecked=lambda: None,
        config=SimpleNamespace(backend="gloo", threads_per_engine=None, init_timeout=5),
        check_packages=(),
        environment=None,
    )
    engines.compared = lambda report: setattr(engines, "environment", report)
    here = str(infos[0]["environment"]["nccl"])  # None on a CPU build of torch
    with pytest.raises(ClusterError, match=rf"nccl differs: node-a has {here}, node-b has 2\.1"):
        start = start_sequence.init_process_group(
            engines,  # type: ignore[arg-type]
            World(),
            lambda world: None,
            StartupProfile(),
            lambda *_: None,
        )
        asyncio.run(start)
    assert opened == []
    assert engines.environment is not None and engines.environment.errors
