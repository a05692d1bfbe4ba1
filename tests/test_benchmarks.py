"""The benchmark runner: a cheap subset end to end, checking the table's structure (never
timings: those are for reading, as ratios measured side by side, not for asserting)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from benchmarks.common import Row, Target, interleaved, median_interval
from benchmarks.run_all import BENCHMARKS, render_markdown

pytestmark = pytest.mark.engines

ROOT = Path(__file__).resolve().parent.parent


def test_quick_subset_writes_markdown_and_json(tmp_path: Path) -> None:
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "benchmarks.run_all",
            "--quick",
            "--only",
            "planner_sweep,plot_update",
            "--out",
            str(tmp_path),
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    report = json.loads((tmp_path / "latest.json").read_text())
    assert report["quick"] is True
    assert report["machine"]["cpus"] >= 1
    assert report["leftover_processes"] == []
    assert [b["name"] for b in report["benchmarks"]] == ["planner_sweep", "plot_update"]
    for bench in report["benchmarks"]:
        assert bench["error"] is None
        assert bench["ran"]
        assert bench["rows"], bench["name"]
        for row in bench["rows"]:
            assert set(row) >= {"metric", "unit", "workbench", "raw", "ratio", "target", "met"}
            assert row["workbench"] is None or row["workbench"] > 0
            if row["raw"] is not None and row["workbench"] is not None and row["raw_label"]:
                # the ratio is what the row says it is: workbench / raw
                assert row["ratio"] == pytest.approx(row["workbench"] / row["raw"])
            if row["target"]:
                assert row["met"] in (True, False)
    sweep = report["benchmarks"][0]
    assert sweep["details"]["configurations"] > 0
    markdown = (tmp_path / "latest.md").read_text()
    assert "| benchmark | metric |" in markdown
    assert markdown.count("| planner_sweep |") == len(sweep["rows"])
    # the printed summary names every row too
    for bench in report["benchmarks"]:
        for row in bench["rows"]:
            assert row["metric"] in proc.stdout


def test_unknown_benchmark_is_an_argument_error(tmp_path: Path) -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "benchmarks.run_all", "--only", "nope", "--out", str(tmp_path)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 2
    assert "nope" in proc.stderr and "planner_sweep" in proc.stderr
    assert not (tmp_path / "latest.json").exists()


def test_every_registered_benchmark_module_exposes_run() -> None:
    import importlib

    for name, module in BENCHMARKS.items():
        mod = importlib.import_module(module)
        assert name == mod.NAME
        assert callable(mod.run)


def test_interleaved_rotates_the_order_and_drops_warmup() -> None:
    calls: list[str] = []

    def variant(name: str):  # type: ignore[no-untyped-def]
        def call() -> float:
            calls.append(name)
            return float(len(calls))

        return call

    samples = interleaved({"a": variant("a"), "b": variant("b"), "c": variant("c")}, 2, warmup=1)
    assert calls == ["a", "b", "c", "b", "c", "a", "c", "a", "b"]
    # warm-up round (calls 1-3) dropped; each sample is the call's own return value
    assert samples == {"a": [6.0, 8.0], "b": [4.0, 9.0], "c": [5.0, 7.0]}


def test_median_interval_holds_the_median_and_narrows_with_more_samples() -> None:
    few = [1.0, 1.2, 0.9, 1.1, 1.05, 0.95, 1.3]
    low, high = median_interval(few)
    assert low <= sorted(few)[3] <= high
    assert median_interval(few) == (low, high)  # a fixed seed: the same report twice
    many = few * 20
    many_low, many_high = median_interval(many)
    assert many_high - many_low < high - low
    assert median_interval([2.0] * 5) == (2.0, 2.0)
    for bad in (0.0, 1.0, float("nan")):
        with pytest.raises(ValueError, match="confidence"):
            median_interval(few, confidence=bad)
    with pytest.raises(ValueError, match="no samples"):
        median_interval([])


def test_traced_loop_pairs_steps_and_shares_the_blocks_start_and_stop() -> None:
    from benchmarks.traced_loop_bench import summarise

    def rank(traced: list[float], untraced: list[float], block: float) -> dict[str, object]:
        steps = [(t, t) for t in traced]
        return {
            "segments": [
                {"variant": "untraced", "steps": [(u, u) for u in untraced]},
                {"variant": "traced", "steps": steps, "start": (block, block), "stop": (0, 0)},
            ],
            "comm_events": 3,
        }

    # Rank 1 is the slower one on the second step: the job's step is the slowest rank's.
    per_rank = [rank([1.0, 1.0], [1.0, 1.0], 0.2), rank([1.0, 1.3], [1.0, 1.2], 0.2)]
    wall = summarise(per_rank)["clocks"]["wall"]
    assert wall["pairs"] == 2
    # Each traced step carries half of the 0.2 s start: (1.1 / 1.0, 1.4 / 1.2), median.
    assert wall["ratio"] == pytest.approx((1.1 / 1.0 + 1.4 / 1.2) / 2)
    assert wall["ratio_every_step"] == pytest.approx((1.2 / 1.0 + 1.5 / 1.2) / 2)
    assert wall["rank_ratio"] == pytest.approx([1.1, (1.1 + 1.4 / 1.2) / 2])
    assert wall["start_stop_s"] == pytest.approx(0.2)


def test_row_ratio_and_target() -> None:
    row = Row.compare("x", "s", 3.0, 2.0, target=Target("<=", 1.2))
    assert row.ratio == pytest.approx(1.5) and row.met is False and row.target == "<= 1.2"
    row = Row.compare("x", "GB/s", 0.95, 1.0, target=Target(">=", 0.9))
    assert row.met is True
    assert Row.compare("x", "s", 1.0, 2.0, target=None).met is None


def test_markdown_shows_errors_and_missed_targets() -> None:
    report = {
        "date": "d",
        "command": "c",
        "quick": False,
        "machine": {"cpus": 2, "platform": "p", "python": "3", "torch": "t", "load_avg_1_5_15": []},
        "load_after": [],
        "seconds": 1.0,
        "benchmarks": [
            {
                "name": "a",
                "title": "A",
                "ran": "r",
                "rows": [vars_of(Row.compare("m", "s", 2.0, 1.0, target=Target("<=", 1.0)))],
                "notes": [],
                "error": None,
                "seconds": 1.0,
            },
            {
                "name": "b",
                "title": "B",
                "ran": "",
                "rows": [],
                "notes": [],
                "error": "Traceback...\nRuntimeError: boom",
                "seconds": 1.0,
            },
        ],
    }
    md = render_markdown(report)
    assert "| a | m | 2 | 1 (raw) | s | 2.000 | <= 1 | **no** |" in md
    assert "| b | ERROR | RuntimeError: boom |" in md


def vars_of(row: Row) -> dict:
    from dataclasses import asdict

    return asdict(row)


def test_peers_table_shows_median_and_spread_per_tool() -> None:
    from benchmarks.peers_bench import render_table

    details = {
        "sizes": [2],
        "cold:2": {"workbench": [3.0, 1.0, 2.0], "nbdistributed": [5.0]},
        "cell:2": {"workbench": [0.010, 0.030, 0.020]},
        "stop:2": {},
    }
    table = render_table(details, ["workbench", "nbdistributed"]).splitlines()
    assert table[0] == "| | workbench | nbdistributed |"
    assert (
        "| cold start to first all-reduce, 2 ranks | 2.00 s (1.00–3.00) | 5.00 s (5.00–5.00) |"
        in table
    )
    assert "| 1-element all-reduce cell, round trip, 2 ranks | 20.0 ms (10.0–30.0) | – |" in table
    assert "| stop cell, 2 ranks | – | – |" in table


def test_markdown_appends_a_benchmarks_own_table() -> None:
    bench = {
        "name": "peers",
        "title": "P",
        "ran": "r",
        "rows": [],
        "notes": [],
        "error": None,
        "seconds": 1.0,
        "details": {"markdown": "| | a |\n|---|---|", "load_avg_1min_before_after": [1.0, 2.0]},
    }
    report = {
        "date": "d",
        "command": "c",
        "quick": False,
        "machine": {"cpus": 2, "platform": "p", "python": "3", "torch": "t", "load_avg_1_5_15": []},
        "load_after": [],
        "seconds": 1.0,
        "benchmarks": [bench],
    }
    md = render_markdown(report)
    assert "## peers: P" in md and "| | a |" in md and "[1.0, 2.0]" in md


@pytest.mark.parametrize("bad", ["0", "-1", "three", "1e3", "101", "nan"])
def test_peers_repeats_from_the_environment_are_checked(
    bad: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    from benchmarks.peers_bench import _repeats

    monkeypatch.setenv("WB_BENCH_REPEATS", bad)
    with pytest.raises(ValueError, match=f"WB_BENCH_REPEATS={bad!r} must be a whole number"):
        _repeats(3)
    monkeypatch.setenv("WB_BENCH_REPEATS", "7")
    assert _repeats(3) == 7
    monkeypatch.delenv("WB_BENCH_REPEATS")
    assert _repeats(3) == 3


def test_a_peers_failed_start_is_recorded_and_taken_again_but_never_the_workbenchs() -> None:
    from benchmarks.peers_bench import PEER_RETRIES, retrying

    calls: list[int] = []

    def flaky() -> float:
        calls.append(1)
        if len(calls) == 1:
            raise RuntimeError("store: Expected 28879, Got 255")
        return 2.5

    failures: dict[str, list[str]] = {}
    assert retrying("jupyter-distributed", flaky, failures)() == 2.5
    assert failures == {"jupyter-distributed": ["RuntimeError: store: Expected 28879, Got 255"]}

    def broken() -> float:
        raise RuntimeError("never starts")

    with pytest.raises(RuntimeError, match="never starts"):
        retrying("nbdistributed", broken, failures)()
    assert len(failures["nbdistributed"]) == PEER_RETRIES + 1
    calls.clear()
    with pytest.raises(RuntimeError, match="Expected 28879"):  # no second try
        retrying("workbench", flaky, failures)()
    assert "workbench" not in failures


def test_peers_fault_rows_take_the_fastest_peer_and_the_issue_targets() -> None:
    from benchmarks.common import BenchResult
    from benchmarks.peers_bench import render_table
    from benchmarks.peers_faults import fault_rows, fault_setup

    details = {
        "sizes": [2, 4],
        "dead:2": {"workbench": [0.05, 0.03, 0.04], "jupyter-distributed": [0.08], "nb": [30.0]},
        "recover:2": {"workbench": [3.0], "jupyter-distributed": [4.0], "nb": [2.0]},
        "hang:2": {"workbench": [5.6], "jupyter-distributed": [5.2]},
        "recover_hang:2": {"workbench": [1.0], "nb": [4.0]},
    }
    result = BenchResult("peers", "P")
    fault_rows(result, details, 2)
    dead, recover, hang, recover_hang = result.rows
    assert (dead.workbench, dead.raw_label, dead.raw, dead.met) == (
        0.04,
        "jupyter-distributed",
        0.08,
        True,
    )
    assert (recover.raw_label, recover.ratio, recover.met) == ("nb", 1.5, False)
    assert (hang.target, hang.met) == ("<= 5.5 s (timeout + 0.5)", False)
    assert (recover_hang.raw_label, recover_hang.ratio, recover_hang.met) == ("nb", 0.25, True)
    table = render_table(details, ["workbench", "nb"])
    assert "| a rank exits mid-cell: seconds until the cell returns, 2 ranks | 0.04 s" in table
    assert "4 ranks" not in table.split("stop cell, 4 ranks")[-1]  # faults at one size only

    class Tool:
        name = "raw ipyparallel"

        @staticmethod
        def setup(n: int) -> list[str]:
            return [f'dist.init_process_group("gloo", init_method="x", world_size={n})']

    (cell,) = fault_setup(Tool, 2)
    assert "timedelta(seconds=5)" in cell and "init_method" in cell


@pytest.mark.parametrize(
    ("argv", "named"),
    [
        (["--modes", "traced"], "'traced'"),  # the untraced run is what the ratios divide by
        (["--modes", "untraced,no_sampels"], "no_samples"),
        (["--against", "/nonexistent/checkout"], "/nonexistent/checkout"),
        (["--steps", "0"], "--steps 0"),
    ],
)
def test_stepper_trace_cost_refuses_bad_input_before_any_cluster(
    argv: list[str], named: str, capsys: pytest.CaptureFixture[str]
) -> None:
    from benchmarks import stepper_trace_cost

    with pytest.raises(SystemExit) as stopped:
        stepper_trace_cost.main(argv)
    assert stopped.value.code == 2
    assert named in capsys.readouterr().err
