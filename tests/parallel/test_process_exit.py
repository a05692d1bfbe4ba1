"""``exit_process``: the torchrun'd entry points end without the interpreter's finalization,
and lose nothing a normal exit would have done (``process_exit.py`` says why)."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

pytestmark = pytest.mark.engines

ENDS = textwrap.dedent(
    """
    import atexit, sys
    from pathlib import Path
    from workbench.parallel.process_exit import exit_process

    atexit.register(lambda: Path(sys.argv[1]).write_text("first"))
    atexit.register(lambda: Path(sys.argv[1]).write_text("last registered, run first"))

    class Finalized:  # what it needs bound now: module globals may be gone by then
        def __del__(self, path=sys.argv[2], open=open):
            with open(path, "w") as f:
                f.write("finalized")

    kept = Finalized()  # a module global: freed only by the interpreter's finalization
    print("buffered, no newline", end="")
    print("to stderr", end="", file=sys.stderr)
    exit_process(3)
    print("never")
    """
)


def test_exit_process_runs_atexit_flushes_and_skips_finalization(tmp_path: Path) -> None:
    handlers, finalized = tmp_path / "atexit.txt", tmp_path / "finalized.txt"
    done = subprocess.run(
        [sys.executable, "-c", ENDS, str(handlers), str(finalized)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 3, done.stderr
    assert done.stdout == "buffered, no newline"  # flushed though piped (block-buffered)
    assert done.stderr == "to stderr"
    assert handlers.read_text() == "first"  # every handler ran, last registered first
    assert not finalized.exists()  # no finalization: nothing for gloo's threads to race


ENTRY = textwrap.dedent(
    """
    import runpy, sys
    from pathlib import Path

    class Finalized:  # what it needs bound now: module globals may be gone by then
        def __del__(self, path=sys.argv[1], open=open):
            with open(path, "w") as f:
                f.write("finalized")

    kept = Finalized()
    module, sys.argv = sys.argv[2], [sys.argv[2], *sys.argv[3:]]
    runpy.run_module(module, run_name="__main__", alter_sys=True)
    """
)


@pytest.mark.parametrize(
    ("module", "args", "error"),
    [
        ("workbench.parallel.job", ["no-such-run.json"], "does not exist"),
        ("workbench.parallel", ["--strategy", "zero9"], "strategy='zero9' is not valid"),
    ],
)
def test_torchrun_entry_points_end_through_exit_process(
    tmp_path: Path, module: str, args: list[str], error: str
) -> None:
    finalized = tmp_path / "finalized.txt"
    done = subprocess.run(
        [sys.executable, "-c", ENTRY, str(finalized), module, *args],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=tmp_path,
    )
    assert done.returncode == 2, done.stderr[-2000:]
    assert error in done.stderr
    assert not finalized.exists()  # ended by exit_process, not by the interpreter's exit


def test_on_an_engine_it_ends_only_the_users_code() -> None:
    """In a script run by ``%wb run`` (or a ``%%wb`` cell) the process is the engine: the
    call ends the script as its exit would, and the engine lives on."""
    from workbench.engine import group_guard
    from workbench.parallel.process_exit import exit_process

    with group_guard.script_running(), pytest.raises(SystemExit) as ended:
        exit_process(5)
    assert ended.value.code == 5
