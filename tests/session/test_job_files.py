"""What ``workbench.export`` writes and refuses, and the job entry point in this process (no
ranks, no subprocess: the unit tier). The exported commands run for real in
``test_job_export.py``."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

import workbench as wb
from tests.parallel import _user_models as um
from workbench.errors import ConfigError
from workbench.parallel.build import build_train_step
from workbench.parallel.checkpoint import load_checkpoint
from workbench.parallel.checkpoint.layout import list_checkpoints
from workbench.parallel.job import build_job_step, main, read_job, run_job
from workbench.parallel.run_spec import RunSpec
from workbench.session.job_files import JobShape, job_for_run, write_export
from workbench.session.user_training import user_spec

FACTORIES = {"data": um.make_data, "loss": um.lm_loss, "optimizer": um.sgd}


def _user_job(model: object = um.make_model, **options: object) -> dict[str, object]:
    spec = user_spec(model, options.pop("strategy", "dp"), {**FACTORIES, **options})
    return job_for_run(spec, 2, 3)


def test_a_user_run_is_exported_by_import_path() -> None:
    job = _user_job(pp_split=["blocks.1"], strategy="pp")
    assert job["factories"] == {
        "model": "tests.parallel._user_models:make_model",
        "data": "tests.parallel._user_models:make_data",
        "loss": "tests.parallel._user_models:lm_loss",
        "optimizer": "tests.parallel._user_models:sgd",
    }
    assert job["layout"]["pp"] == 2 and job["layout"]["pp_split"] == ["blocks.1"]
    json.dumps(job)  # the job file is plain JSON


@pytest.mark.parametrize(
    ("model", "why"),
    [
        (lambda: um.make_model(), "it is notebook code"),
        ("make_model", "it is a name defined on the engines ('make_model')"),
    ],
)
def test_what_cannot_be_exported_says_what_to_do(model: object, why: str) -> None:
    with pytest.raises(ConfigError, match="cannot be exported") as info:
        _user_job(model)
    assert why in str(info.value)
    assert "pass model='package.module:attr'" in str(info.value)


def test_notebook_functions_are_not_importable_by_name() -> None:
    def make_model() -> object:  # what a notebook cell defines: module __main__ or local
        return um.make_model()

    with pytest.raises(ConfigError, match=r"model=.*make_model cannot be exported"):
        _user_job(make_model)


def test_bad_shapes_fail_before_anything_is_written(tmp_path: Path) -> None:
    script = Path(um.__file__)
    with pytest.raises(ConfigError, match=r"nodes=0 is not valid: out of range"):
        wb.export(str(script), tmp_path / "a", nodes=0, procs_per_node=2)
    with pytest.raises(ConfigError, match=r"procs_per_node=None is not valid"):
        wb.export(str(script), tmp_path / "b")
    with pytest.raises(ConfigError, match=r"target='Linear' is not valid: not a Stepper"):
        wb.export(__import__("torch").nn.Linear(1, 1), tmp_path / "c")
    assert not any(tmp_path.iterdir())


def test_checkpointed_job_checks_for_the_key_and_never_copies_it(tmp_path: Path) -> None:
    job = job_for_run(RunSpec(model="mlp-tiny", strategy="single"), 1, 2)
    done = write_export(
        tmp_path / "job", shape=JobShape(procs_per_node=1), job=job, key_dir="/keys here"
    )
    for kind in ("torchrun", "sbatch"):
        text = done.files[kind].read_text()
        assert "export WORKBENCH_STATE_DIR='/keys here'" in text
        assert "if [ ! -f '/keys here/checkpoint.key' ]; then" in text
    assert sorted(p.name for p in done.directory.iterdir()) == [
        "job.sbatch",
        "run.json",
        "torchrun.sh",
    ]


def test_the_job_saves_checkpoints_the_notebook_can_load(tmp_path: Path) -> None:
    # strategy single: one process, no group; the key is this test session's state dir's.
    spec = RunSpec(model="mlp-tiny", strategy="single", optimizer="sgd", trace=False)
    job = job_for_run(spec, 1, 4)
    job["checkpoint"] = {"dir": str(tmp_path / "ckpt"), "every": 2, "keep_last": 3}
    losses = run_job(job, 4)
    assert [c["step"] for c in list_checkpoints(tmp_path / "ckpt")] == [2, 4]
    notebook = build_train_step(spec)  # what the stepper would load it into
    meta = load_checkpoint(notebook, tmp_path / "ckpt")
    assert meta["step"] == 4 and meta["last_loss"] == losses[-1]


def test_a_user_job_builds_the_same_run_as_the_spec() -> None:
    step = build_job_step({**_user_job(strategy="single"), "kind": "user"})
    try:
        assert type(step.model).__name__ == "TinyLM"
        assert step.run_step() > 0
    finally:
        step.close()


def test_job_files_are_checked(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    bad = tmp_path / "run.json"
    bad.write_text(json.dumps({"format": "something-else"}))
    with pytest.raises(ConfigError, match="has format 'something-else'; expected"):
        read_job(bad)
    assert main([str(tmp_path / "missing.json")]) == 2
    assert "does not exist; write one with %wb export DIR" in capsys.readouterr().err


MIGRATION = Path(__file__).resolve().parents[1] / "cluster" / "scripts" / "migration_ddp.py"


def test_the_command_line_exports_a_script_and_a_job_again(tmp_path: Path) -> None:
    from workbench.cli import main as cli

    first = tmp_path / "one"
    assert cli(["export", "--procs-per-node", "3", str(first), str(MIGRATION), "--batch", "6"]) == 0
    text = (first / "torchrun.sh").read_text()
    assert "--nproc-per-node 3 \\\n" in text and text.endswith(f"    {MIGRATION} --batch 6\n")
    job = tmp_path / "run.json"
    job.write_text(json.dumps(job_for_run(RunSpec(model="mlp-tiny"), 2, 3)))
    again = ["export", "--job", str(job), "--nodes", "2", "--steps", "7", "--procs-per-node", "4"]
    assert cli([*again, str(tmp_path / "two")]) == 0
    assert json.loads((tmp_path / "two" / "run.json").read_text())["steps"] == 7
    assert "#SBATCH --nodes=2" in (tmp_path / "two" / "job.sbatch").read_text()
    assert cli(["export", "--job", str(tmp_path / "none.json"), str(tmp_path / "three")]) == 2
    assert cli(["export", str(tmp_path / "four")]) == 2  # neither a script nor a job


def test_a_user_job_is_exported_again_only_for_its_own_rank_count(tmp_path: Path) -> None:
    from workbench.export import export_job

    job = tmp_path / "run.json"
    job.write_text(json.dumps(_user_job(strategy="fsdp")))  # dp=2, written out
    export_job(job, tmp_path / "same", nodes=2, procs_per_node=1)
    with pytest.raises(ConfigError, match=r"does not fit nodes x procs_per_node = 8 ranks: dp\*tp"):
        export_job(job, tmp_path / "more", nodes=2, procs_per_node=4)


def test_the_magic_exports_a_script_and_says_what_is_missing(
    ipython_shell: object, tmp_path: Path
) -> None:
    from IPython.core.error import UsageError

    run = ipython_shell.run_line_magic  # type: ignore[attr-defined]
    run("wb", f"export --procs-per-node 2 {tmp_path / 'a'} {MIGRATION} --batch 8")
    assert f"{MIGRATION} --batch 8" in (tmp_path / "a" / "torchrun.sh").read_text()
    with pytest.raises(UsageError, match="--nodes after DIR is not valid; options go before"):
        run("wb", f"export {tmp_path / 'b'} --nodes 2")


def test_a_comparison_exports_one_folder_per_strategy(tmp_path: Path) -> None:
    from workbench.compare import StrategyComparison

    specs = [user_spec(um.make_model, s, dict(FACTORIES)) for s in ("dp", "fsdp", "fsdp")]
    comparison = StrategyComparison(model="make_model", steps=3, specs=[(s, 2) for s in specs])
    done = wb.export(comparison, tmp_path)
    assert isinstance(done, list)
    assert [d.directory.name for d in done] == ["dp", "fsdp", "fsdp-2"]  # none overwritten
    jobs = [json.loads(d.files["job"].read_text()) for d in done]
    assert [(j["strategy"], j["steps"], j["layout"]["zero"]) for j in jobs] == [
        ("dp", 3, 0),
        ("fsdp", 3, 3),
        ("fsdp", 3, 3),
    ]


def test_options_that_are_objects_cannot_be_exported() -> None:
    from workbench.session.job_files import json_option

    assert json_option("checkpointing", ("blocks.0", "blocks.1")) == ["blocks.0", "blocks.1"]
    with pytest.raises(ConfigError, match="checkpointing=<class .*Linear'> cannot be exported"):
        json_option("checkpointing", __import__("torch").nn.Linear)


def test_checkpointing_patterns_travel_through_the_job_file() -> None:
    job = json.loads(json.dumps(_user_job(strategy="single", checkpointing=["blocks.*"])))
    assert job["options"]["checkpointing"] == ["blocks.*"]
    step = build_job_step(job)
    try:
        assert step.spec.checkpointing == ("blocks.*",)  # as the stepper's run holds it
        assert step.run_step() > 0
    finally:
        step.close()


def test_sbatch_names_gloos_interface_per_node_unless_the_user_did(tmp_path: Path) -> None:
    # gloo would bind the address the node's own name resolves to (127.0.1.1 on stock
    # Debian); each node works out its interface inside srun, where it runs
    done = wb.export(str(MIGRATION), tmp_path / "job", nodes=2, procs_per_node=1)
    text = done.files["sbatch"].read_text()
    srun = text[text.index("srun ") :]
    assert "ifname=${GLOO_SOCKET_IFNAME:-$(node_interface)}" in srun
    assert "export -f node_interface" in text[: text.index("srun ")]
    assert srun.rstrip().endswith(f"torchrun {MIGRATION}")
