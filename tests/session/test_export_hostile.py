"""What ``workbench export`` and the job entry point do with files they did not write:
nothing the job names is run at export, no generated line can be injected into, and a
malformed ``run.json`` is one line naming what is wrong (unit tier: no processes)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from tests.parallel import _user_models as um
from workbench.parallel.job import main as job_main
from workbench.parallel.run_spec import RunSpec
from workbench.session.job_files import job_for_run
from workbench.session.user_training import user_spec

FACTORIES = {"data": um.make_data, "loss": um.lm_loss, "optimizer": um.sgd}


def _cli(argv: list[str]) -> int:
    from workbench.cli import main

    return main(argv)


def _user_job() -> dict[str, Any]:
    return job_for_run(user_spec(um.make_model, "dp", dict(FACTORIES)), 2, 3)


def test_export_job_locates_the_factories_modules_without_running_them(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    marker = tmp_path / "imported"
    package = tmp_path / "src" / "evilpkg"
    package.mkdir(parents=True)
    (package / "__init__.py").write_text(f"open({str(marker)!r}, 'w').write('pkg')\n")
    (package / "models.py").write_text(f"open({str(marker)!r}, 'w').write('mod')\n")
    monkeypatch.syspath_prepend(str(tmp_path / "src"))
    job = _user_job()
    job["factories"]["model"] = "evilpkg.models:make_model"
    run_json = tmp_path / "run.json"
    run_json.write_text(json.dumps(job))
    assert _cli(["export", "--job", str(run_json), str(tmp_path / "out")]) == 0
    assert not marker.exists()  # located, never imported
    assert str(tmp_path / "src") in (tmp_path / "out" / "torchrun.sh").read_text()


def test_a_script_name_cannot_inject_lines_into_the_sbatch_script(tmp_path: Path) -> None:
    script = tmp_path / "x\ntouch pwned\n#SBATCH --uid=0\n.py"
    script.write_text("print('hi')\n")
    assert _cli(["export", "--procs-per-node", "1", str(tmp_path / "out"), str(script)]) == 0
    lines = (tmp_path / "out" / "job.sbatch").read_text().splitlines()
    assert "touch pwned" not in lines
    heads = [line for line in lines if line.startswith("#SBATCH")]
    assert [h.split("=")[0] for h in heads] == [
        "#SBATCH --job-name",
        "#SBATCH --nodes",
        "#SBATCH --ntasks-per-node",
        "#SBATCH --cpus-per-task",
    ]
    name = heads[0].split("=", 1)[1]
    assert name.replace("-", "").replace("_", "").replace(".", "").isalnum()


def _preset() -> dict[str, Any]:
    return job_for_run(RunSpec(model="mlp-tiny"), 2, 3)


BAD_JOBS = {
    "spec-not-object": (lambda j: j.update(spec="mlp"), "spec"),
    "spec-unknown-field": (lambda j: j["spec"].update(bogus=1), "bogus"),
    "spec-missing": (lambda j: j.pop("spec"), "spec"),
    "steps-text": (lambda j: j.update(steps="many"), "steps"),
    "steps-negative": (lambda j: j.update(steps=-1), "steps"),
    "checkpoint-text": (lambda j: j.update(checkpoint="x"), "checkpoint"),
    "checkpoint-every": (lambda j: j.update(checkpoint={"dir": "c", "every": "x"}), "every"),
}
BAD_USER_JOBS = {
    "layout-missing": (lambda j: j.pop("layout"), "layout"),
    "factories-list": (lambda j: j.update(factories=[]), "factories"),
    "factory-number": (lambda j: j["factories"].update(model=3), "model"),
    "factory-no-attr": (lambda j: j["factories"].update(model="pkg.mod"), "model"),
    "factory-unknown-role": (lambda j: j["factories"].update(sampler="a:b"), "sampler"),
    "layout-text": (lambda j: j["layout"].update(tp="two"), "tp"),
    "options-text": (lambda j: j.update(options="x"), "options"),
    "strategy-number": (lambda j: j.update(strategy=3), "strategy"),
}


@pytest.mark.parametrize(
    ("make", "change", "named"),
    [(_preset, *v) for v in BAD_JOBS.values()] + [(_user_job, *v) for v in BAD_USER_JOBS.values()],
    ids=list(BAD_JOBS) + list(BAD_USER_JOBS),
)
def test_a_malformed_job_file_is_one_line_naming_the_field(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], make: Any, change: Any, named: str
) -> None:
    job = make()
    change(job)
    run_json = tmp_path / "run.json"
    run_json.write_text(json.dumps(job))
    out = tmp_path / "out"
    assert _cli(["export", "--job", str(run_json), str(out)]) == 2
    assert not out.exists()  # nothing written for an invalid file
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and named in err, err
    assert job_main([str(run_json)]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and named in err, err


def test_export_into_a_file_or_an_unwritable_folder_is_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    script = tmp_path / "train.py"
    script.write_text("print('hi')\n")
    a_file = tmp_path / "a-file"
    a_file.write_text("")
    assert _cli(["export", "--procs-per-node", "1", str(a_file), str(script)]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and str(a_file) in err, err
    below_a_file = a_file / "sub"
    assert _cli(["export", "--procs-per-node", "1", str(below_a_file), str(script)]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and str(below_a_file) in err, err
