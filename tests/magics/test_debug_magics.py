"""pdb on the ranks, typed into the notebook (issue 45), as a person uses it: a real kernel
driven with jupyter_client, its ``input_request`` prompts answered as a person types them.

One kernel and one 2-rank cluster serve the module. "No stdin" is an execute request with
``allow_stdin=False``, which is what nbclient (and so nbval) sends for every cell
(``NotebookClient`` sets ``kc.allow_stdin = False``).
"""

from __future__ import annotations

import queue
import re
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

pytestmark = [pytest.mark.engines, pytest.mark.slow]

_ANSI = re.compile(r"\x1b\[[0-9;]*m")
INTERRUPT = object()  # an "answer": the person presses the notebook's stop button instead
_BOUND_S = 180.0


@dataclass
class Ran:
    """What one cell showed: its text (streams, displays, the error) and the prompts."""

    text: str = ""
    prompts: list[str] = field(default_factory=list)
    error: str | None = None


def _run(
    kc: Any, code: str, answers: Sequence[object] = (), *, stdin: bool = True, pause: float = 0.0
) -> Ran:
    """Execute ``code``; answer each input_request with the next of ``answers``, each
    after ``pause`` seconds (a person thinking)."""
    left = list(answers)
    ran = Ran()
    msg_id = kc.execute(code, allow_stdin=stdin)
    deadline = time.monotonic() + _BOUND_S
    idle = False
    while not idle:
        assert time.monotonic() < deadline, f"no end in {_BOUND_S} s: {ran}"
        try:
            msg = kc.stdin_channel.get_msg(timeout=0.02)
        except queue.Empty:
            pass
        else:
            if msg["msg_type"] == "input_request":
                ran.prompts.append(msg["content"]["prompt"])
                assert left, f"an unexpected prompt {msg['content']['prompt']!r}: {ran}"
                time.sleep(pause)
                answer = left.pop(0)
                if answer is INTERRUPT:
                    kc.parent.interrupt_kernel()  # (the client's parent: its KernelManager)
                else:
                    kc.input(answer)
        try:
            msg = kc.iopub_channel.get_msg(timeout=0.02)
        except queue.Empty:
            continue
        if msg["parent_header"].get("msg_id") != msg_id:
            continue
        kind, content = msg["msg_type"], msg["content"]
        if kind == "stream":
            ran.text += content["text"]
        elif kind in ("display_data", "update_display_data", "execute_result"):
            ran.text += content.get("data", {}).get("text/plain", "") + "\n"
        elif kind == "error":
            ran.error = _ANSI.sub("", "\n".join(content["traceback"]))
        elif kind == "status" and content["execution_state"] == "idle":
            idle = True
    assert not left, f"prompts not asked for: {left}; {ran}"
    return ran


@pytest.fixture(scope="module")
def kc() -> Iterator[Any]:
    from jupyter_client.manager import start_new_kernel

    km, client = start_new_kernel(kernel_name="python3", startup_timeout=_BOUND_S)
    try:
        for code in ("%load_ext workbench", "%wb start -n 2"):
            ran = _run(client, code)
            assert ran.error is None, ran
        yield client
    finally:
        _run(client, "%wb stop")
        client.stop_channels()
        km.shutdown_kernel(now=True)


def test_post_mortem_on_the_rank_that_failed_then_every_rank_runs_on(kc: Any) -> None:
    failed = _run(
        kc,
        "%%wb\nimport torch.distributed as dist\nrank = dist.get_rank()\n"
        "def step(batch):\n    scale = 7 * (rank + 1)\n"
        "    if rank == 1:\n        raise ValueError(f'bad batch {batch}')\n    return scale\n"
        "step(3)",
    )
    assert failed.error is not None and "bad batch 3" in failed.error, failed
    ran = _run(kc, "%wb debug", ["p rank", "p scale", "p batch", "q"])
    assert ran.prompts == ["[rank 1] (Pdb) "] * 4, ran
    assert ran.error is None, ran
    # pdb's own output: where it stopped, then each answer, in order
    assert "raise ValueError(f'bad batch {batch}')" in ran.text, ran
    answers = [line for line in ran.text.splitlines() if line in ("1", "14", "3")]
    assert answers == ["1", "14", "3"], ran
    assert "left the debugger on rank 1" in ran.text, ran
    after = _run(kc, "%%wb\nprint('after', dist.get_rank())")
    assert after.error is None, after
    assert "after 0" in after.text and "after 1" in after.text, after
    # the next cell let the failed frame go: nothing left to debug
    gone = _run(kc, "%wb debug")  # (a UsageError: IPython prints it, no error message)
    assert "UsageError: no rank has a failed cell to debug" in gone.text, gone
    bad = _run(kc, "%wb debug --rank 7")
    assert "UsageError: --rank 7 is not valid: this cluster has ranks 0..1" in bad.text, bad


@pytest.mark.parametrize("path", ["", "--via-controller"])
def test_a_breakpoint_pauses_its_rank_and_continues(kc: Any, path: str) -> None:
    code = f"%%wb --ranks 1 {path}\ny = 41\nbreakpoint()\ny += 1\nprint(y)"
    ran = _run(kc, code, ["p y", "c"])
    assert ran.error is None, ran
    assert ran.prompts == ["[rank 1] (Pdb) "] * 2, ran
    assert "41" in ran.text.splitlines(), ran
    assert "42" in ran.text.splitlines(), ran


def test_q_at_a_breakpoint_stops_that_ranks_cell_with_a_clear_error(kc: Any) -> None:
    ran = _run(kc, "%%wb --ranks 1\nbreakpoint()\nprint('not reached')", ["q"])
    assert ran.error is not None and "`q` was typed at its (Pdb) prompt" in ran.error, ran
    assert "not reached" not in ran.text, ran


def test_without_stdin_a_breakpoint_is_one_clear_error(kc: Any) -> None:
    ran = _run(kc, "%%wb --ranks 1\ny = 41\nbreakpoint()\nprint('after', y)", stdin=False)
    assert ran.prompts == [], ran
    assert ran.error is not None, ran
    assert "DebuggerUnavailable" in ran.error and "no stdin" in ran.error, ran
    assert "%wb debug --rank 1" in ran.error, ran
    assert "after 41" not in ran.text, ran


def test_two_ranks_at_a_breakpoint_prompt_one_at_a_time(kc: Any) -> None:
    code = (
        "%%wb\nimport torch.distributed as dist\n"
        "v = 10 + dist.get_rank()\nbreakpoint()\nprint('v', v)"
    )
    ran = _run(kc, code, ["p v", "c", "p v", "c"])
    assert ran.error is None, ran
    first, second = ran.prompts[0], ran.prompts[2]
    assert ran.prompts == [first, first, second, second], ran
    assert {first, second} == {"[rank 0] (Pdb) ", "[rank 1] (Pdb) "}, ran
    assert "10" in ran.text.splitlines() and "11" in ran.text.splitlines(), ran


def test_the_timeout_does_not_run_out_while_a_rank_waits_at_its_prompt(kc: Any) -> None:
    ran = _run(kc, "%%wb --ranks 1 --timeout 1\nbreakpoint()\nprint('went on')", ["c"], pause=2)
    assert ran.error is None, ran
    assert "went on" in ran.text, ran


def test_a_script_stops_at_its_breakpoint_and_is_debugged_after_it_failed(
    kc: Any, tmp_path: Path
) -> None:
    script = tmp_path / "train.py"
    script.write_text(
        "import torch.distributed as dist\n"
        "dist.init_process_group('gloo')\n"
        "z = 5 * dist.get_rank()\n"
        "breakpoint()\n"
        "z += 1\n"
        "print('z', z)\n"
        "def load(shard):\n"
        "    path = f'shard-{shard}.bin'\n"
        "    raise FileNotFoundError(path)\n"
        "load(z)\n"
    )
    ran = _run(kc, f"%wb run --ranks 1 {script}", ["p z", "c"])
    assert ran.prompts == ["[rank 1] (Pdb) "] * 2, ran
    assert "5" in ran.text.splitlines() and "z 6" in ran.text, ran
    assert ran.error is not None and "shard-6.bin" in ran.error, ran
    mortem = _run(kc, "%wb debug --rank 1", ["p path", "q"])
    assert mortem.prompts == ["[rank 1] (Pdb) "] * 2, mortem
    assert "'shard-6.bin'" in mortem.text.splitlines(), mortem


def test_code_sent_from_python_raises_at_a_breakpoint_saying_how_to_debug(kc: Any) -> None:
    """``Cluster.execute`` from a script and ``Cluster.run`` have no one to answer."""
    ran = _run(
        kc,
        "from workbench import Cluster\n"
        "cluster = Cluster.latest()\n"
        "[r] = cluster.execute('breakpoint()', ranks=1)\n"
        "print(r.ename, '|', r.evalue)\n"
        "try:\n"
        "    cluster.run(breakpoint, ranks=0)\n"
        "except Exception as exc:\n"
        "    print(type(exc).__name__, '|', exc)",
    )
    assert ran.error is None, ran
    lines = ran.text.splitlines()
    assert lines[0].startswith("DebuggerUnavailable | breakpoint() on rank 1 cannot stop"), ran
    assert "RankError" in lines[1] and "breakpoint() on rank 0 cannot stop" in ran.text, ran
    assert ran.text.count("%wb debug --rank") == 2, ran


def test_the_stop_button_at_a_prompt_ends_the_cell_and_the_ranks_run_on(kc: Any) -> None:
    ran = _run(kc, "%%wb --ranks 1\nbreakpoint()\nprint('not reached')", [INTERRUPT])
    assert ran.prompts == ["[rank 1] (Pdb) "], ran
    assert ran.error is not None and "KeyboardInterrupt" in ran.error, ran
    after = _run(kc, "%%wb\nimport torch.distributed as dist\nprint('still here', dist.get_rank())")
    assert after.error is None and "still here 1" in after.text, after


def test_each_breakpoint_of_a_loop_stops_again_after_c(kc: Any) -> None:
    code = "%%wb --ranks 0\nfor i in range(2):\n    breakpoint()\n    print('i is', i)"
    ran = _run(kc, code, ["p i", "c", "p i", "c"])
    assert ran.error is None, ran
    assert ran.prompts == ["[rank 0] (Pdb) "] * 4, ran
    lines = ran.text.splitlines()
    assert "0" in lines and "1" in lines and "i is 1" in ran.text, ran
