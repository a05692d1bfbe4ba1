"""Every code block of README.md that a user would paste runs as written, in order, in one
IPython shell (magics through the shell, as in a notebook; the ``workbench`` command lines
of bash blocks as commands) in a temporary directory. Blocks that cannot run here are
skipped, each with its reason; a skip that no longer matches exactly one block fails."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from tests._readme_blocks import Block, blocks

pytestmark = [pytest.mark.engines, pytest.mark.slow, pytest.mark.timeout(1800)]

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"

# A piece of a block's text -> why that block cannot run here.
SKIPS = {
    "make demo": "make's own targets: the demo and the whole test suite (make test runs them)",
    "%wb start -n 4 --launcher ssh": "ssh / mpi / slurm engines on real nodes "
    "(tests/multinode runs the launchers on its 2-node bed, as root)",
    "wb.Stepper(**mine, dp=2, tp=2": "needs 4 ranks; the doc test's cluster has 2 "
    "(tests/parallel checks these layouts on 4 forked ranks)",
    "workbench demo --model mypkg": "names a package of your own (mypkg); wb.compare above "
    "runs the same on a model defined here",
    "--nbval-workbench my_notebooks/": "pytest on your notebooks: tests/test_nbval_plugin.py "
    "runs these "
    "commands on a notebook it writes",
    "errors.py, config.py": "a directory tree, not code",
    "$ pytest --nbval": "a transcript of the command above, not code",
    "%wb run train.py --epochs 2": "runs your own train.py / evaluate.py; "
    "tests/cluster/test_run_script.py runs a torchrun script through %wb run",
    'cluster.run_script("train.py"': "runs your own train.py; tests/cluster/test_run_script.py "
    "runs a torchrun script through Cluster.run_script",
    "%wb export --procs-per-node 2 job-script train.py": "exports your own train.py; "
    "tests/session/test_job_export.py exports a torchrun script and runs it",
    "python3 -m venv .venv-gpu": "a GPU machine's venv (CUDA wheels); make gpu-check runs it "
    "(tools/gpu_check.sh, dry-run here)",
    'raise ValueError(f"bad batch {batch}")': "a transcript of pdb commands typed at the "
    "notebook's prompt; tests/magics/test_debug_magics.py types them into a real kernel",
    "In [6]: %%wb --ranks 1": "a transcript of a breakpoint answered at the notebook's "
    "prompt; tests/magics/test_debug_magics.py answers it in a real kernel",
}
# Nothing is run between blocks: the README is pasted top to bottom into one shell, as a
# reader does (the stepper's block starts its own cluster when the first one was stopped).
SETUPS: dict[str, str] = {}


def _reason(block: Block) -> str | None:
    found = [why for key, why in SKIPS.items() if key in block.code]
    return found[0] if found else None


ALL = blocks(README)
RUN = [b for b in ALL if _reason(b) is None]


def test_every_skip_names_one_block_and_every_block_is_run_or_skipped() -> None:
    for key in [*SKIPS, *SETUPS]:
        assert sum(key in b.code for b in ALL) == 1, f"{key!r} must match exactly one block"
    assert all(b.kind in ("python", "magics", "bash") for b in RUN), [
        b.code[:60] for b in RUN if b.kind == "other"
    ]


@pytest.fixture(scope="module")
def results(tmp_path_factory: pytest.TempPathFactory) -> dict[int, dict[str, Any]]:
    where = tmp_path_factory.mktemp("readme")
    out = where / "results.json"
    setups = {b.index: s for b in RUN for key, s in SETUPS.items() if key in b.code}
    env = {**os.environ, "PYTHONPATH": str(ROOT), "IPP_NONINTERACTIVE": "1"}
    subprocess.run(
        [sys.executable, str(ROOT / "tests" / "_readme_blocks.py"), str(README), str(out),
         json.dumps([b.index for b in RUN]), json.dumps(setups)],
        cwd=where, env=env, timeout=1500, check=False,
    )  # fmt: skip
    return {r["index"]: r for r in json.loads(out.read_text())} if out.exists() else {}


@pytest.mark.parametrize("block", ALL, ids=[f"block{b.index}" for b in ALL])
def test_readme_block_runs_as_written(block: Block, results: dict[int, dict[str, Any]]) -> None:
    reason = _reason(block)
    if reason is not None:
        pytest.skip(reason)
    assert block.index in results, "the run stopped before this block"
    result = results[block.index]
    assert result["ok"], f"README block {block.index}:\n{block.code}\n---\n{result['error']}"
