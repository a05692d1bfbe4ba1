"""The engine forker started ahead by the workbench kernel (cluster/warm_forker.py,
kernel_launcher.py): taken by the first local cluster when its environment matches, given
up (and stopped) when it does not, and never left running — not when the kernel exits, not
when it is killed."""

from __future__ import annotations

import json
import os
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import psutil
import pytest

from tests.processes import BOUND_S, alive
from workbench.cluster import Cluster, warm_forker
from workbench.engine import zygote

# Starting a torch-importing process and a kernel: generous, on a busy 2-core machine.
KERNEL_BOUND_S = 120.0


def test_env_changes_lists_what_to_set_and_what_to_remove() -> None:
    started = {"A": "1", "B": "2", "GONE": "x"}
    wanted = {"A": "1", "B": "3", "NEW": "y"}
    assert warm_forker.env_changes(started, wanted) == {"B": "3", "NEW": "y", "GONE": None}


def test_only_variables_nothing_imported_has_read_may_differ() -> None:
    assert warm_forker.compatible({"IPP_CLUSTER_ID": "c1", "MPLBACKEND": "inline", "TERM": None})
    for key in ("OMP_NUM_THREADS", "CUDA_VISIBLE_DEVICES", "PYTHONPATH", "TORCH_LOGS"):
        assert not warm_forker.compatible({"IPP_CLUSTER_ID": "c1", key: "1"}), key


def test_the_request_line_is_one_line_of_json() -> None:
    line = warm_forker.request_line(2, ["--a=1"], {"X": None}, "/w", "/w/out.log")
    assert line.endswith(b"\n") and line.count(b"\n") == 1
    assert json.loads(line) == {
        "n": 2,
        "args": ["--a=1"],
        "env": {"X": None},
        "cwd": "/w",
        "output": "/w/out.log",
    }


@pytest.fixture
def no_warm_forker() -> Iterator[None]:
    assert warm_forker.warm() is None
    try:
        yield
    finally:
        warm_forker.stop()


@pytest.mark.engines
def test_a_local_cluster_takes_the_warm_forker(no_warm_forker: None) -> None:
    forker = warm_forker.spawn().process
    assert warm_forker.spawn().process is forker  # one per kernel
    cluster = Cluster(n=2, backend="gloo")
    cluster.start_sync()
    try:
        assert warm_forker.warm() is None  # taken
        parents = {psutil.Process(r.pid).ppid() for r in cluster.ranks}
        assert parents == {forker.pid}
        assert forker.pid in cluster.pids()  # watched and stopped like a fresh one
        for eid in (r.engine_id for r in cluster.ranks):
            row = cluster.startup.engines[eid]
            assert row["process_started"] <= row["forked"] <= row["registered"]
        out = cluster.execute("import torch.distributed as dist\nprint(dist.get_world_size())")
        assert [r.stdout.strip() for r in out] == ["2", "2"]
        (launcher,) = cluster._ipp.engines.values()  # type: ignore[union-attr]
        assert Path(launcher.output_file).is_file()  # the engines' output goes there
    finally:
        pids = cluster.pids()
        cluster.stop_sync()
    assert forker.wait(BOUND_S) is not None
    assert alive(pids) == []


@pytest.mark.engines
def test_a_changed_environment_gives_up_the_warm_forker(
    no_warm_forker: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    forker = warm_forker.spawn().process
    monkeypatch.setenv("OMP_NUM_THREADS", "7")  # numpy's BLAS reads it at import
    assert warm_forker.take(dict(os.environ)) is None
    assert forker.poll() is not None  # stopped, not left behind
    assert warm_forker.warm() is None


@pytest.mark.engines
def test_a_warm_forker_ends_when_its_pipe_closes(no_warm_forker: None) -> None:
    process = warm_forker.spawn().process
    assert process.stdin is not None
    process.stdin.close()  # as when the kernel that started it is gone
    assert process.wait(KERNEL_BOUND_S) == 0
    warm_forker.stop()
    assert warm_forker.warm() is None


@pytest.fixture
def workbench_kernel(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> str:
    from workbench.cli.kernel import install

    install(name="wb-test", prefix=str(tmp_path))
    monkeypatch.setenv("JUPYTER_PATH", str(tmp_path / "share" / "jupyter"))
    return "wb-test"


def _run(client: object, code: str) -> str:
    out: list[str] = []

    def hook(msg: dict) -> None:
        content = msg["content"]
        if msg["msg_type"] == "stream":
            out.append(content["text"])
        elif msg["msg_type"] == "error":
            out.append("\n".join(content["traceback"]))
        elif msg["msg_type"] == "execute_result":
            out.append(content["data"]["text/plain"])

    client.execute_interactive(code, output_hook=hook, timeout=KERNEL_BOUND_S)  # type: ignore[attr-defined]
    return "".join(out)


def _forker_of(client: object) -> int:
    text = _run(
        client, "from workbench.cluster import warm_forker\nprint(warm_forker.warm().process.pid)"
    )
    return int(text.strip())


@pytest.mark.engines
def test_the_workbench_kernel_starts_the_forker_that_wb_start_forks_from(
    workbench_kernel: str,
) -> None:
    from jupyter_client.manager import start_new_kernel

    km, kc = start_new_kernel(kernel_name=workbench_kernel, startup_timeout=KERNEL_BOUND_S)
    try:
        forker = _forker_of(kc)
        assert zygote.__file__ in psutil.Process(forker).cmdline()
        _run(kc, "%load_ext workbench")
        assert "2 ranks" in _run(kc, "%wb start -n 2")
        text = _run(kc, "%%wb\nimport os\nprint('parent', os.getppid())")
        assert text.count(f"parent {forker}") == 2, text
        assert "stopped" in _run(kc, "%wb stop")
        deadline = time.monotonic() + BOUND_S
        while alive([forker]) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert alive([forker]) == []
    finally:
        kc.stop_channels()
        km.shutdown_kernel()


@pytest.mark.engines
@pytest.mark.parametrize("how", ["shutdown", "killed"])
def test_a_workbench_kernel_that_never_started_a_cluster_leaves_nothing(
    workbench_kernel: str, how: str
) -> None:
    from jupyter_client.manager import start_new_kernel

    km, kc = start_new_kernel(kernel_name=workbench_kernel, startup_timeout=KERNEL_BOUND_S)
    try:
        forker = psutil.Process(_forker_of(kc))
    finally:
        kc.stop_channels()
        km.shutdown_kernel(now=how == "killed")
    gone, left = psutil.wait_procs([forker], timeout=KERNEL_BOUND_S)
    assert left == [] and gone


def test_the_kernel_spec_runs_this_interpreter_with_the_workbench_launcher(tmp_path: Path) -> None:
    from workbench.cli import main

    assert main(["kernel", "install", "--prefix", str(tmp_path), "--name", "wbk"]) == 0
    spec = json.loads((tmp_path / "share/jupyter/kernels/wbk/kernel.json").read_text())
    assert spec["argv"] == [
        sys.executable,
        "-m",
        "workbench.kernel_launcher",
        "-f",
        "{connection_file}",
    ]
    assert spec["language"] == "python"


def test_a_bad_kernel_name_is_refused_before_anything_is_written(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from workbench.cli import main

    assert main(["kernel", "install", "--prefix", str(tmp_path), "--name", "a b"]) == 2
    assert "'a b'" in capsys.readouterr().err
    assert not (tmp_path / "share").exists()
