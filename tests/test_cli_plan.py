"""``workbench plan`` and ``workbench calibrate`` through ``main(argv)``."""

from __future__ import annotations

import contextlib
import io
import json
import subprocess
import sys

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

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


# -- issue 12 (items 11 and 13): the CLI loads only what it runs, and checks every flag --


def _run_cli_in_fresh_python(argv: list[str]) -> subprocess.CompletedProcess[str]:
    """main(argv) in a new interpreter, which then asserts no heavy module got imported."""
    code = (
        "import sys\n"
        "from workbench.cli import main\n"
        f"rc = main({argv!r})\n"
        "heavy = [m for m in ('torch', 'numpy', 'IPython', 'plotly') if m in sys.modules]\n"
        "assert not heavy, heavy\n"
        "print('RC', rc)\n"
    )
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)


@pytest.mark.engines
@pytest.mark.parametrize(
    "argv",
    [
        ["plan", "--model", "llama2-7b", "--gpus", "8", "--zero", "3"],
        ["plan", "--model", "llama2-7b", "--gpu", "h100-80gb", "--gpus", "64", "--recommend"],
        ["plan", "--list", "--json"],
        ["calibrate", "--iters", "0"],  # rejected before torch (or any rank) is touched
    ],
)
def test_plan_and_calibrate_errors_never_import_torch(argv):
    out = _run_cli_in_fresh_python(argv)
    assert out.returncode == 0, out.stderr  # the in-process assert held
    assert "RC " in out.stdout and "Traceback" not in out.stderr


def test_gpus_negative_names_the_flag_the_user_typed(capsys):
    assert main(["plan", "--model", "llama2-7b", "--gpus", "-3"]) == 2
    err = capsys.readouterr().err
    assert "--gpus" in err and "-3" in err and "dp" not in err
    assert err.count("\n") == 1


def test_gpus_zero_with_recommend_is_an_error_not_one_gpu(capsys):
    assert main(["plan", "--model", "llama2-7b", "--gpus", "0", "--recommend"]) == 2
    captured = capsys.readouterr()
    assert "--gpus" in captured.err and "0" in captured.err
    assert "Recommended" not in captured.out


def test_reserve_gb_must_leave_memory_on_the_card(capsys):
    assert main(["plan", "--model", "llama2-7b", "--gpu", "a100-80gb", "--reserve-gb", "90"]) == 2
    err = capsys.readouterr().err
    assert "--reserve-gb 90" in err and "85.9 GB" in err and err.count("\n") == 1


@pytest.mark.parametrize(
    ("content", "expected"),
    [
        ("not json", "cannot read it as JSON"),
        ("[1, 2]", "expected a JSON object"),
        ('{"hardware": {"memory": 5}}', "are missing"),
        ('{"memory": 10, "peak_flops": 1, "intra": 3, "inter": 3}', "intra=3"),
        ('{"memory": 10, "peak_flops": NaN, "intra": {"bandwidth": 1, "latency": 0},'
         ' "inter": {"bandwidth": 1, "latency": 0}}', "peak_flops=nan"),
        ('{"memory": 10, "peak_flops": 1, "intra": {"bandwidth": Infinity, "latency": 0},'
         ' "inter": {"bandwidth": 1, "latency": 0}}', "bandwidth=inf"),
        ('{"memory": 10, "peak_flops": 1, "intra": {"speed": 1},'
         ' "inter": {"bandwidth": 1, "latency": 0}}', "unknown link fields"),
        ('{"memory": 10, "bogus": 1}', "unknown hardware fields"),
    ],
)  # fmt: skip
def test_malformed_hardware_json_is_one_clear_line(tmp_path, capsys, content, expected):
    path = tmp_path / "hw.json"
    path.write_text(content)
    assert main(["plan", "--model", "gpt2-small", "--hardware-json", str(path)]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"workbench plan: error: --hardware-json {path}: ")
    assert expected in err and err.count("\n") == 1


def test_missing_hardware_json_is_one_clear_line(tmp_path, capsys):
    assert main(["plan", "--params", "1e9", "--hardware-json", str(tmp_path / "no.json")]) == 2
    err = capsys.readouterr().err
    assert "--hardware-json" in err and "No such file" in err and err.count("\n") == 1


def test_calibrate_validates_before_starting_any_rank(monkeypatch, capsys):
    import workbench.parallel.planning.commbench as commbench

    def must_not_run(*args, **kwargs):
        raise AssertionError("ranks were started before the arguments were checked")

    monkeypatch.setattr(commbench, "run_local_sweep", must_not_run)
    for argv, flag in (
        (["--iters", "0"], "--iters"),
        (["--world-size", "1"], "--world-size"),
        (["--warmup", "-1"], "--warmup"),
        (["--sizes", "0", "4096"], "--sizes"),
        (["--sizes", "4096", "4096"], "--sizes"),
    ):
        assert main(["calibrate", *argv]) == 2
        err = capsys.readouterr().err
        assert flag in err and err.count("\n") == 1, err


# flag -> (integer?, low, high, low end open?)
NUMERIC_FLAGS: dict[str, tuple[bool, float, float, bool]] = {
    "--params": (False, 1, 1e15, False),
    "--layers": (True, 1, 1e8, False),
    "--hidden": (True, 1, 1e8, False),
    "--heads": (True, 1, 1e8, False),
    "--kv-heads": (True, 1, 1e8, False),
    "--ffn": (True, 1, 1e8, False),
    "--vocab": (True, 1, 1e8, False),
    "--seq": (True, 1, 1e8, False),
    "--micro-batch": (True, 1, 1e8, False),
    "--global-batch": (True, 1, 1e8, False),
    "--grad-accum": (True, 1, 1e8, False),
    "--micro-batches": (True, 1, 1e8, False),
    "--trainable": (False, 0, 1, True),
    "--mfu": (False, 0, 1, True),
    "--memory-traffic": (False, 0, 1000, False),
    "--overlap": (False, 0, 1, False),
    "--reserve-gb": (False, 0, 1e6, False),
    "--gpus": (True, 1, 2**20, False),
    "--gpus-per-node": (True, 1, 1024, False),
    "--dp": (True, 1, 2**20, False),
    "--tp": (True, 1, 2**20, False),
    "--pp": (True, 1, 2**20, False),
    "--virtual-stages": (True, 1, 1024, False),
}


@st.composite
def bad_numeric_flag(draw):
    flag = draw(st.sampled_from(sorted(NUMERIC_FLAGS)))
    integer, low, high, low_open = NUMERIC_FLAGS[flag]
    if integer:
        below = st.integers(max_value=int(low) - 1).map(str)
        above = st.integers(min_value=int(high) + 1).map(str)
    else:
        below = st.floats(max_value=low, allow_nan=False, allow_infinity=False)
        if not low_open:
            below = below.filter(lambda x: x < low)
        below = below.map(repr)
        above = st.floats(min_value=high, allow_nan=False, allow_infinity=False)
        above = above.filter(lambda x: x > high).map(repr)
    text = draw(
        st.one_of(
            st.sampled_from(["nan", "NaN", "inf", "-inf", "Infinity", "", "abc", "1e999"]),
            below,
            above,
            st.just("2.5") if integer else st.just("one"),
        )
    )
    return flag, text


@settings(max_examples=150, deadline=None)
@given(bad_numeric_flag())
def test_every_bad_numeric_flag_exits_2_with_one_line_naming_it(case):
    flag, text = case
    err = io.StringIO()
    with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
        rc = main(["plan", "--model", "llama2-7b", f"{flag}={text}"])
    message = err.getvalue()
    assert rc == 2
    assert message.count("\n") == 1 and "Traceback" not in message
    assert f"argument {flag}:" in message


@settings(max_examples=80, deadline=None)
@given(
    st.dictionaries(
        st.sampled_from(sorted(NUMERIC_FLAGS)),
        st.one_of(
            st.integers(-4, 70_000).map(str),
            st.floats(-1e3, 1e16).map(repr),
            st.sampled_from(["nan", "inf", "0.5", "1", "8", "64"]),
        ),
        max_size=5,
    )
)
def test_any_numeric_flags_plan_or_fail_in_one_line(values):
    """Whatever numbers are given, the CLI prints a plan or one error line: never a
    traceback, never a hang."""
    argv = ["plan", "--params", "1e9"] + [f"{k}={v}" for k, v in values.items()]
    err = io.StringIO()
    with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
        rc = main(argv)
    assert rc in (0, 2)
    if rc == 2:
        assert err.getvalue().count("\n") == 1 and "Traceback" not in err.getvalue()
    else:
        assert err.getvalue() == ""


def test_issue16_switches_reach_the_plan(capsys):
    rc = main(
        ["plan", "--model", "llama3-405b", "--gpu", "h100-80gb", "--tp", "8", "--pp", "16",
         "--dp", "64", "--zero", "1", "--sp", "--micro-batches", "32", "--seq", "8192",
         "--flash-attention", "--fused-swiglu", "--first-stage-layers", "7",
         "--last-stage-layers", "7", "--json"]
    )  # fmt: skip
    assert rc == 0
    data = json.loads(capsys.readouterr().out)
    assert data["fits"] is True and data["memory"]["stage"] == 1
    assert data["training"]["flash_attention"] and data["training"]["fused_swiglu"]
    assert 0 < data["time"]["mfu"] <= data["time"]["hfu"]
    rc = main(
        ["plan", "--layers", "4", "--hidden", "256", "--heads", "4", "--vocab", "1000",
         "--gated-mlp", "--norm", "rmsnorm", "--tied-embeddings", "--bias", "--tp", "2",
         "--no-vocab-parallel", "--cp", "2", "--grads", "fp32", "--json"]
    )  # fmt: skip
    assert rc == 0
    data = json.loads(capsys.readouterr().out)
    assert data["parallel"]["cp"] == 2 and data["parallel"]["vocab_parallel"] is False
    assert data["gpus"] == 4


def test_cli_default_step_time_is_the_per_operation_model_as_in_python(capsys):
    from workbench.planner import plan

    argv = ["plan", "--model", "llama2-7b", "--gpu", "a100-80gb", "--dp", "8", "--json"]
    assert main(argv) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["training"]["mfu"] is None and data["training"]["memory_traffic"] is None
    assert data["time"]["step_s"] == pytest.approx(plan("llama2-7b", dp=8).time.total)
    assert main([*argv, "--mfu", "0.5", "--memory-traffic", "2"]) == 0
    flat = json.loads(capsys.readouterr().out)
    expected = plan("llama2-7b", dp=8, mfu=0.5, memory_traffic=2.0).time.total
    assert flat["time"]["step_s"] == pytest.approx(expected)


def test_fp8_and_offload_switches_reach_the_plan(capsys):
    rc = main(
        ["plan", "--model", "llama2-7b", "--gpu", "h100-80gb", "--gpus", "8", "--zero", "2",
         "--fp8", "--offload-optimizer", "--offload-activations", "--json"]
    )  # fmt: skip
    assert rc == 0
    data = json.loads(capsys.readouterr().out)
    t = data["training"]
    assert t["fp8"] and t["offload_optimizer"] and t["offload_activations"]
    assert data["memory"]["grads"] == data["memory"]["optimizer"] == 0
    assert data["memory"]["host"] > 0 and data["time"]["offload_s"] > 0
    rc = main(["plan", "--model", "llama2-7b", "--gpu", "a100-80gb", "--fp8"])
    assert rc == 2
    assert "has no FP8 peak" in capsys.readouterr().err


def test_zero3_prefetch_module_is_deepspeeds_slower_zero3(capsys):
    argv = ["plan", "--model", "llama2-70b", "--gpu", "a100-80gb", "--gpus", "512",
            "--zero", "3", "--recompute", "full", "--json"]  # fmt: skip
    steps = {}
    for mode in ("layer", "module"):
        assert main([*argv, "--zero3-prefetch", mode]) == 0
        steps[mode] = json.loads(capsys.readouterr().out)["time"]["step_s"]
    assert steps["module"] > steps["layer"]
    assert main([*argv, "--zero3-prefetch", "fsdp"]) == 2
    assert "layer" in capsys.readouterr().err
