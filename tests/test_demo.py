"""The main job end to end on its own small cluster: every strategy checked and reported."""

from __future__ import annotations

from pathlib import Path

import pytest

from workbench.cli import main
from workbench.demo import run_demo, write_demo_report

pytestmark = pytest.mark.engines


def test_demo_runs_checks_and_reports(tmp_path: Path) -> None:
    results = run_demo(strategies=("dp", "fsdp"), steps=2, log=lambda _line: None)
    assert [r.strategy for r in results] == ["dp", "fsdp"]
    for r in results:
        assert r.check is not None and r.check["steps"] == 2
        assert r.check["max_param_diff"] <= 1e-5
        row = r.summary(2)
        assert row["model state / rank (MiB)"] > 0
        assert (
            "all_reduce" in row["collectives / step"] or "all_gather" in row["collectives / step"]
        )
        categories = {x["category"] for x in r.validation["rows"]}
        assert {"weights", "grads", "optimizer", "activations"} <= categories
    # fsdp shards parameters: less model state per rank than dp
    dp, fsdp = (r.summary(2)["model state / rank (MiB)"] for r in results)
    assert fsdp < dp
    report = write_demo_report(results, tmp_path, steps=2, model="gpt-tiny")
    text = report.read_text()
    assert "Every strategy, side by side" in text and "Planner predictions" in text
    assert (tmp_path / "trace_dp.json").exists() and (tmp_path / "trace_fsdp.json").exists()


def test_demo_rejects_bad_strategies(capsys: object) -> None:
    assert main(["demo", "--strategies", "dp,warp"]) == 2
    assert main(["demo", "--steps", "0"]) == 2
