"""``workbench plan`` and ``workbench calibrate`` through ``main(argv)``."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from workbench.cli import main


def test_plan_7b_zero3_json_reports_14gb_of_model_state(capsys):
    rc = main(
        ["plan", "--params", "7e9", "--gpu", "a100-80gb", "--gpus", "8", "--zero", "3",
         "--precision", "bf16-mixed", "--optimizer", "adam", "--recompute", "full", "--json"]
    )  # fmt: skip
    assert rc == 0
    data = json.loads(capsys.readouterr().out)
    mem = data["memory"]
    assert mem["weights"] + mem["grads"] + mem["optimizer"] == 16 * 7e9 / 8
    assert data["parallel"]["dp"] == 8 and data["fits"] is True


def test_plan_human_table_shows_the_breakdown_and_verdict(capsys):
    rc = main(["plan", "--model", "llama2-7b", "--gpu", "a100-80gb", "--gpus", "1"])
    out = capsys.readouterr().out
    assert rc == 0
    for word in ("weights", "gradients", "optimizer state", "activations", "OOM", "tokens/s"):
        assert word in out


def test_recommend_prints_reasons(capsys):
    rc = main(["plan", "--model", "llama2-7b", "--gpu", "h100-80gb", "--gpus", "64", "--recommend"])
    out = capsys.readouterr().out
    assert rc == 0 and "Recommended" in out and "layout" in out


def test_unknown_preset_exits_2_listing_the_presets(capsys):
    assert main(["plan", "--model", "gpt-9"]) == 2
    err = capsys.readouterr().err
    assert "gpt-9" in err and "'llama3-70b'" in err
    assert main(["plan", "--model", "llama2-7b", "--gpu", "tpu"]) == 2
    assert "'h200-141gb'" in capsys.readouterr().err


def test_bad_layout_exits_2(capsys):
    assert main(["plan", "--model", "llama2-7b", "--tp", "3"]) == 2
    assert "valid tp" in capsys.readouterr().err
    assert main(["plan", "--model", "llama2-7b", "--gpus", "8", "--dp", "4"]) == 2
    assert main(["plan", "--gpus", "abc"]) == 2  # argparse type error


@pytest.mark.engines
def test_calibrate_saves_a_profile_that_plan_accepts(tmp_path, capsys):
    out = tmp_path / "cpu.json"
    rc = main(
        ["calibrate", "--sizes", "4096", "1048576", "8388608", "--iters", "3", "--warmup", "1",
         "--no-flops", "--out", str(out)]
    )  # fmt: skip
    assert rc == 0
    profile = json.loads(out.read_text())
    assert profile["fit"]["bandwidth_Bps"] > 0 and profile["hardware"]["kind"] == "cpu"
    assert "latency" in capsys.readouterr().out
    rc = main(["plan", "--model", "gpt2-small", "--hardware-json", str(out), "--gpus", "2",
               "--precision", "fp32", "--json"])  # fmt: skip
    assert rc == 0
    plan = json.loads(capsys.readouterr().out)
    assert plan["hardware"]["intra"]["bandwidth"] == profile["fit"]["bandwidth_Bps"]


@pytest.mark.engines
def test_python_dash_m_workbench_runs_the_cli():
    out = subprocess.run(
        [sys.executable, "-m", "workbench", "plan", "--list"],
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert out.returncode == 0 and "llama3-405b" in out.stdout
