"""The README's fenced code blocks, and a driver that runs them as a user pastes them.

``python tests/_readme_blocks.py README.md RESULTS.json INDEX...`` runs the chosen blocks
in order in one IPython shell (magics included, ``%load_ext workbench`` as the README
writes it), ``workbench ...`` lines of bash blocks as commands, in the current directory,
and writes one result per block: ``{"index", "ok", "error"}``.
"""

from __future__ import annotations

import json
import re
import shlex
import subprocess
import sys
import traceback
from dataclasses import dataclass
from pathlib import Path

FENCE = re.compile(r"^```(\w*)\n(.*?)^```$", re.MULTILINE | re.DOTALL)


@dataclass(frozen=True)
class Block:
    index: int
    lang: str
    code: str

    @property
    def kind(self) -> str:
        """python (a cell), magics (each line a cell), bash, or other (not code)."""
        lines = [ln for ln in self.code.splitlines() if ln.strip()]
        if self.lang == "python":
            return "python"
        if self.lang == "bash":
            return "bash"
        if self.lang == "" and lines and all(ln.lstrip().startswith("%") for ln in lines):
            return "magics"
        return "other"


def blocks(readme: Path) -> list[Block]:
    return [
        Block(i, m.group(1), m.group(2)) for i, m in enumerate(FENCE.finditer(readme.read_text()))
    ]


def _run_block(shell: object, block: Block) -> None:
    if block.kind == "python":
        cells = [block.code]
    elif block.kind == "magics":
        cells = [ln.split("  #")[0].strip() for ln in block.code.splitlines() if ln.strip()]
    else:  # bash: the workbench command lines, each as a command
        for line in block.code.replace("\\\n", " ").splitlines():
            if line.strip():
                argv = shlex.split(line.split(" #")[0])
                argv[0] = str(Path(sys.executable).with_name(argv[0]))
                done = subprocess.run(argv, capture_output=True, text=True, timeout=600)
                if done.returncode:
                    raise RuntimeError(f"{line}: exit {done.returncode}\n{done.stderr[-2000:]}")
        return
    for cell in cells:
        result = shell.run_cell(cell)  # type: ignore[attr-defined]
        if not result.success:
            error = result.error_in_exec or result.error_before_exec
            raise RuntimeError(f"{type(error).__name__}: {error}\nin cell:\n{cell}")


def main(readme: str, out: str, chosen: list[int], setups: dict[int, str]) -> None:
    from IPython.testing.globalipapp import start_ipython

    shell = start_ipython()
    results = []
    for block in blocks(Path(readme)):
        if block.index not in chosen:
            continue
        try:
            if block.index in setups:
                shell.run_cell(setups[block.index])  # type: ignore[union-attr]
            _run_block(shell, block)
            results.append({"index": block.index, "ok": True, "error": None})
        except Exception as exc:
            text = "".join(traceback.format_exception_only(exc))[-4000:]
            results.append({"index": block.index, "ok": False, "error": text})
        Path(out).write_text(json.dumps(results))
    shell.run_cell("%wb stop")  # type: ignore[union-attr]


if __name__ == "__main__":
    setups = {int(k): v for k, v in json.loads(sys.argv[4]).items()}
    main(sys.argv[1], sys.argv[2], json.loads(sys.argv[3]), setups)
