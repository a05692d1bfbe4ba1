"""``wb.compare`` and ``workbench demo --model package.module:factory``: the demo's report for
a model the test defines (on the shared 2-rank cluster), and bad input refused before any
process starts."""

from __future__ import annotations

from pathlib import Path

import cloudpickle
import pytest

from tests.parallel import _user_models as um
from workbench.cli import main
from workbench.cluster import Cluster
from workbench.compare import compare
from workbench.errors import ConfigError

cloudpickle.register_pickle_by_value(um)  # as a notebook's classes travel

BASE = {"model": um.make_model, "data": um.make_data, "loss": um.lm_loss, "optimizer": um.sgd}


def test_compare_reports_every_strategy_against_single_and_the_planner(
    cluster: Cluster, tmp_path: Path
) -> None:
    lines: list[str] = []
    result = compare(
        **BASE,
        strategies=["dp", "fsdp", {"dp": 1, "tp": 2}, "pp"],
        tp_plan=um.TP_PLAN,
        steps=2,
        cluster=cluster,
        out=tmp_path,
        log=lines.append,
    )
    assert [r.strategy for r in result.results] == ["dp", "fsdp", "tp=2", "pp"]
    assert len(lines) == 4 and result.max_param_diff <= 1e-5
    for r in result.results:
        assert r.check is not None and r.check["steps"] == 2
        assert r.check["max_param_diff"] <= 1e-5 and r.check["max_loss_diff"] <= 1e-5
    # Model state equals the planner's to the byte under every layout (TP too: the plan
    # leaves the embedding, head and norms whole); DDP and FSDP's data-parallel bytes too.
    # Activations within the report's 10%, the pipeline's first stage (rank 0) included.
    for i, r in enumerate(result.results):
        rows = {row["category"]: row for row in r.validation["rows"]}
        for category in ("weights", "grads", "optimizer", "dp bytes/step")[: 4 if i < 2 else 3]:
            assert rows[category]["measured"] == rows[category]["predicted"], (r.strategy, category)
        assert rows["activations"]["ok"] and rows["activations"]["measured"] > 0, r.strategy
    table = result.table
    assert [row["strategy"] for row in table] == ["dp", "fsdp", "tp=2", "pp"]
    fsdp_state, dp_state = (row["model state / rank (MiB)"] for row in (table[1], table[0]))
    assert fsdp_state < dp_state
    text = result.report.read_text()
    assert "Every strategy, side by side" in text and "make_model" in text
    assert "counted on the meta device" in text
    for name in ("dp", "fsdp", "tp2", "pp"):
        assert (tmp_path / f"trace_{name}.json").exists()
    assert "max |Δparam|" in str(result) and "report:" in str(result)


@pytest.mark.parametrize(
    ("strategies", "match"),
    [
        (["megatron"], "teaching view"),
        (["warp"], "warp"),
        ([{"tp": 2, "width": 3}], "width"),
        (["dp", "dp"], "given twice"),
        ("dp", "give a list"),
        ([], "give a list"),
        ([{"tp": 3}], "tp"),
    ],
)
def test_bad_strategies_fail_before_any_process(strategies: object, match: str) -> None:
    with pytest.raises(ConfigError, match=match):
        compare(**BASE, strategies=strategies, out=None)  # type: ignore[arg-type]


@pytest.mark.parametrize("steps", [0, -1, 2.5, True, 10**9])
def test_bad_steps_fail_before_any_process(steps: object) -> None:
    with pytest.raises(ConfigError, match="steps"):
        compare(**BASE, steps=steps)  # type: ignore[arg-type]


def test_demo_cli_names_what_a_user_model_needs(capsys: pytest.CaptureFixture[str]) -> None:
    model = "tests.parallel._user_models:make_model"
    assert main(["demo", "--model", model]) == 2
    assert "--data" in capsys.readouterr().err
    assert main(["demo", "--model", "tests.parallel._user_models:nope", "--data", "x:y"]) == 2
    assert "could not be imported" in capsys.readouterr().err
    assert main(["demo", "--model", "gpt-huge"]) == 2
    assert "package.module:factory" in capsys.readouterr().err


@pytest.mark.engines
def test_demo_cli_runs_a_user_factory(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    mod = "tests.parallel._user_models"
    code = main(
        [
            "demo", "--model", f"{mod}:make_model", "--data", f"{mod}:make_data",
            "--loss", f"{mod}:lm_loss", "--optimizer", f"{mod}:adamw",
            "--strategies", "dp,zero1", "--steps", "2", "--out", str(tmp_path),
        ]
    )  # fmt: skip
    out = capsys.readouterr().out
    assert code == 0, out
    assert "zero1" in out and "max |Δparam|" in out
    assert (tmp_path / "report.html").exists() and (tmp_path / "trace_zero1.json").exists()


def test_a_layout_the_planner_cannot_model_is_a_note_not_a_crash() -> None:
    """The planner read no head count from a hand-written model (1 assumed) and refuses
    tp=2: compare used to raise after every strategy had run; now that row is a note."""
    import dataclasses

    from workbench.compare import _checked_validation
    from workbench.demo import StrategyResult
    from workbench.parallel.planning.spec_from_model import meta_model, user_model_spec
    from workbench.session.user_training import user_spec

    options = {k: v for k, v in BASE.items() if k != "model"}
    spec = user_spec(um.make_model, "dp", {**options, "tp": 2, "tp_plan": um.TP_PLAN})
    model = dataclasses.replace(user_model_spec(um.make_model), heads=1, kv_heads=1)
    notes: list[str] = []
    result = StrategyResult(strategy="tp=2", events=[])
    planned = (model, um.SEQ, "sgd", meta_model(um.make_model))
    assert _checked_validation(result, spec, planned, 2, notes) is None
    assert notes == [
        "no planner rows for tp=2: tp=2 does not divide heads=1 (kv_heads=1); valid tp: [1]"
    ]
