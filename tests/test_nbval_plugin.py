"""``pytest --nbval --nbval-workbench`` on notebooks written in a temporary directory, as a
user runs it: the plugin (installed by the package's ``pytest11`` entry point) applies the
shipped sanitizer merged with the user's own file; and the kind of notebook a researcher
writes (a seeded Hugging Face GPT-2 with dropout under a DP stepper, a ``%%wb``
all-reduce, ``%wb status``), recorded once, passes strict nbval twice in a row."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import nbformat
import pytest

pytestmark = pytest.mark.engines


def _notebook(path: Path, cells: list[tuple[str, str | None]]) -> Path:
    """A notebook of (source, recorded stdout or None for no output) code cells."""
    nb = nbformat.v4.new_notebook()
    nb.metadata["kernelspec"] = {
        "name": "python3",
        "display_name": "Python 3",
        "language": "python",
    }
    for source, out in cells:
        cell = nbformat.v4.new_code_cell(source)
        if out is not None:
            cell.execution_count = len(nb.cells) + 1
            cell.outputs = [nbformat.v4.new_output("stream", name="stdout", text=out)]
        nb.cells.append(cell)
    nbformat.write(nb, path)
    return path


def _nbval(where: Path, *options: str, timeout: float = 600) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "IPP_NONINTERACTIVE": "1", "PYTHONWARNINGS": "ignore"}
    return subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "--nbval",
         "--nbval-current-env", *options, str(where)],
        cwd=where if where.is_dir() else where.parent, env=env, capture_output=True,
        text=True, timeout=timeout,
    )  # fmt: skip


def test_the_plugin_applies_the_shipped_rules_merged_with_the_users(tmp_path: Path) -> None:
    # Recorded on another run: another duration, another loss.
    nb = _notebook(
        tmp_path / "mine.ipynb",
        [("print(f'took {0.53} s, loss {4.1234}')", "took 1.2 s, loss 4.2\n")],
    )
    own = tmp_path / "mine.cfg"
    own.write_text("[loss]\nregex: loss \\d+\\.\\d+\nreplace: loss LOSS\n")
    alone = _nbval(nb)
    shipped_only = _nbval(nb, "--nbval-workbench")
    merged = _nbval(nb, "--nbval-workbench", "--nbval-sanitize-with", str(own))
    for failed in (alone, shipped_only):  # the loss differs: only the user's rule masks it
        assert failed.returncode == 1 and "Cell outputs differ" in failed.stdout, failed.stdout
    assert merged.returncode == 0, merged.stdout[-3000:]
    assert not list(tmp_path.glob("workbench-nbval-*"))  # the merged file is in $TMPDIR


def test_a_broken_user_file_is_one_clear_error(tmp_path: Path) -> None:
    nb = _notebook(tmp_path / "mine.ipynb", [("1", None)])
    own = tmp_path / "mine.cfg"
    own.write_text("regex: x\nreplace:\n")  # nbval itself would drop this rule silently
    result = _nbval(nb, "--nbval-workbench", "--nbval-sanitize-with", str(own))
    assert result.returncode == 4
    assert "1 'regex:' lines but nbval reads 0 rules" in result.stderr


RESEARCH = [
    "%load_ext workbench\n%wb start -n 2",
    "import torch\nimport workbench as wb\n"
    "from transformers import GPT2Config, GPT2LMHeadModel\n\n"
    "def make_model():\n"
    "    return GPT2LMHeadModel(GPT2Config(n_layer=2, n_embd=32, n_head=2, vocab_size=32,"
    " n_positions=8))\n\n"
    "def make_data():\n"
    "    g = torch.Generator().manual_seed(0)\n"
    "    x = torch.randint(0, 32, (64, 8), generator=g)\n"
    "    return torch.utils.data.TensorDataset(x, (x + 1) % 32)\n\n"
    "def loss_fn(output, y):\n"
    "    return torch.nn.functional.cross_entropy(output.logits.flatten(0, 1), y.flatten())",
    "stepper = wb.Stepper(model=make_model, data=make_data, loss=loss_fn, strategy='dp')\n"
    "stepper.run(3)\n"
    "print('dp', [round(s.loss, 4) for s in stepper.status])\n"
    "print([round(x, 4) for x in stepper.reference_losses()])",
    "%%wb\nt = torch.ones(3) * (rank + 1)\ndist.all_reduce(t)\nprint(t.tolist())",
    "%wb status",
    "%wb stop",
]


@pytest.mark.slow
@pytest.mark.timeout(1800)
def test_a_researchers_notebook_passes_strict_nbval_twice_after_one_recording(
    tmp_path: Path,
) -> None:
    pytest.importorskip("transformers")
    from nbclient import NotebookClient

    nb = _notebook(tmp_path / "research.ipynb", [(c, None) for c in RESEARCH])
    recorded = nbformat.read(nb, as_version=4)
    NotebookClient(recorded, timeout=600, resources={"metadata": {"path": str(tmp_path)}}).execute()
    nbformat.write(recorded, nb)
    text = nb.read_text()
    assert "dp [" in text and "[3.0, 3.0, 3.0]" in text and "rank  engine" in text
    for attempt in (1, 2):
        result = _nbval(nb, "--nbval-workbench")
        assert result.returncode == 0, f"run {attempt}:\n{result.stdout[-4000:]}"
