"""On the engines: a script file run as ``torchrun`` would run it, inside the cluster's group.

``%wb run script.py ...`` (``Cluster.run_script``) sends every chosen rank one cell that
calls ``run_script``, so its output, errors, timeouts and dead engines are those of a
``%%wb`` cell. The script runs as ``__main__`` (``runpy.run_path``, as torchrun's
``--run-path`` does) with ``sys.argv`` set, its folder first on ``sys.path``, the kernel's
folder as working directory and the environment torchrun gives a worker
(``LocalElasticAgent._start_workers``). What a process would have ended at exit ends
when the script does:

- Accelerate's singletons (``AcceleratorState``, ``GradientState``) are reset before and
  after (``ACCELERATE_USE_CPU`` is set on CPU ranks when they join the group:
  ``process_group``);
- ``atexit`` handlers it registered run at its end, last registered first (those a module
  registers while it is first imported stay: the module outlives the script);
- process groups it created are destroyed; the cluster's is kept (``group_guard``);
- ``sys.argv``, ``sys.path``, the working directory, the environment, torch's thread
  count, every signal handler it changed, the signal mask and the timers (``alarm``,
  ``setitimer``) are put back, and modules it imported from its own folder are
  forgotten, so an edited helper module is read again next time;
- a child it forks (``os.fork``) ends where a process would: at ``sys.exit``, an
  uncaught exception or the script's end, with ``os._exit`` and that exit status; it
  never goes on as a copy of the engine. File descriptors 1 and 2 it closes or
  redirects are put back when the cell ends (``cell_fds``).

``SystemExit`` with code 0 or None is success, as for a process; any other code is this
rank's failure (``ScriptExit``).
"""

from __future__ import annotations

import atexit
import os
import runpy
import signal
import sys
import traceback
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

from workbench.engine import group_guard, hang
from workbench.engine.cell_fds import flush_c_stdio
from workbench.engine.state import engine_state

__all__ = ["ScriptExit", "run_script", "torchrun_environment"]


_TIMERS = (signal.ITIMER_REAL, signal.ITIMER_VIRTUAL, signal.ITIMER_PROF)  # REAL: alarm()


class ScriptExit(RuntimeError):
    """The script ended with ``sys.exit(code)``, ``code`` neither 0 nor None."""


def torchrun_environment(assignment: dict[str, Any], run_id: str) -> dict[str, str]:
    """The variables torchrun sets for a worker, for this engine's rank."""
    rank, world = str(assignment["rank"]), str(assignment["world_size"])
    return {
        "RANK": rank,
        "LOCAL_RANK": str(assignment["local_rank"]),
        "GROUP_RANK": str(assignment["node_rank"]),
        "ROLE_RANK": rank,
        "ROLE_NAME": "default",
        "LOCAL_WORLD_SIZE": str(assignment["local_world_size"]),
        "GROUP_WORLD_SIZE": str(assignment["num_nodes"]),
        "ROLE_WORLD_SIZE": world,
        "WORLD_SIZE": world,
        "MASTER_ADDR": str(assignment["master_addr"]),
        "MASTER_PORT": str(assignment["master_port"]),
        "TORCHELASTIC_RESTART_COUNT": "0",
        "TORCHELASTIC_MAX_RESTARTS": "0",
        "TORCHELASTIC_RUN_ID": run_id,
        # True would make rank 0 a client of an elastic agent's store, and there is none
        "TORCHELASTIC_USE_AGENT_STORE": "False",
    }


def run_script(
    path: str, args: list[str], cwd: str | None, run_id: str, trace: bool = False
) -> None:
    """Run the script at ``path`` as ``__main__`` with ``sys.argv = [path, *args]``;
    ``trace``: the run is one span of this rank's ``wb.traced`` recorder, its collectives
    and its DDP model's memory recorded (``engine/script_trace.py``)."""
    if not trace:
        _run_script(path, args, cwd, run_id)
        return
    from workbench.engine.script_trace import traced_script

    with traced_script(f"script {os.path.basename(path)}"):
        _run_script(path, args, cwd, run_id)


def _run_script(path: str, args: list[str], cwd: str | None, run_id: str) -> None:
    import socket

    assignment = engine_state().assignment
    if assignment is None:
        raise RuntimeError("this engine has not joined the cluster's process group")
    if not os.path.isfile(path):
        raise FileNotFoundError(
            f"script {path!r} is not a file on host {socket.gethostname()} "
            f"(rank {assignment['rank']}); the engines read it from their own file system"
        )
    group_guard.install()
    current = hang.ledger()
    if current is not None:  # the script's collectives are counted as a cell's (autopsy)
        current.new_cell()
    folder = os.path.dirname(path)
    _reset_accelerate()  # what an earlier run or cell left in Accelerate's singletons
    with _restored(folder), _exit_handlers() as handlers, _own_groups():
        os.environ.update(torchrun_environment(assignment, run_id))
        if cwd is not None and os.path.isdir(cwd):  # not there on another host: stay
            os.chdir(cwd)
        sys.argv = [path, *args]
        sys.path.insert(0, folder)
        try:
            _run_main(path, assignment["rank"])
        finally:
            _run_handlers(handlers)
            _reset_accelerate()


def _reset_accelerate() -> None:
    """Accelerate keeps its state in per-process singletons (``AcceleratorState``,
    ``GradientState``): a new process would start without them, so each run does too
    (``TrainingArguments._setup_devices`` resets them the same way)."""
    state = sys.modules.get("accelerate.state")
    if state is not None:
        state.AcceleratorState._reset_state(reset_partial_state=True)
        state.GradientState._reset_state()


def _run_main(path: str, rank: int) -> None:
    engine = os.getpid()
    try:
        with group_guard.script_running():
            runpy.run_path(path, run_name="__main__")
    except SystemExit as exc:
        _end_if_forked(engine, exc.code)
        if exc.code not in (None, 0):
            raise ScriptExit(
                f"{os.path.basename(path)} exited with code {exc.code!r} on rank {rank}"
            ) from None
    except BaseException as exc:
        if os.getpid() != engine:
            os.write(2, traceback.format_exc().encode(errors="replace"))
            _end_if_forked(engine, 1)
        # The traceback from the script's own first frame on: runpy's frames say nothing.
        tb = exc.__traceback__
        while tb is not None and tb.tb_frame.f_code.co_filename != path:
            tb = tb.tb_next
        raise exc.with_traceback(tb or exc.__traceback__)  # noqa: B904 (the same exception)
    _end_if_forked(engine, 0)


def _end_if_forked(engine: int, code: Any) -> None:
    """In a child the script forked (``os.fork``), end the process here with the exit
    status a process would have had: it is a copy of the engine, and must never go back
    to serving cells (its parent's ``waitpid`` would never return). Nothing else of the
    engine's is run in it (``os._exit``: no atexit handlers, no buffers of the engine's)."""
    if os.getpid() == engine:
        return
    if code is None:
        status = 0
    elif isinstance(code, int) and not isinstance(code, bool):
        status = code & 0xFF
    else:  # sys.exit("message"): printed, status 1, as Python does
        os.write(2, f"{code}\n".encode(errors="replace"))
        status = 1
    flush_c_stdio()
    os._exit(status)


@contextmanager
def _restored(folder: str) -> Iterator[None]:
    """Put back what a process's end would have thrown away."""
    import torch

    argv, path, cwd = list(sys.argv), list(sys.path), os.getcwd()
    environ, threads = dict(os.environ), torch.get_num_threads()
    handlers = {s: signal.getsignal(s) for s in signal.valid_signals()}
    mask = signal.pthread_sigmask(signal.SIG_BLOCK, [])
    timers = {t: signal.getitimer(t) for t in _TIMERS}
    modules = set(sys.modules)
    try:
        yield
    finally:
        # What it blocked or scheduled would outlive it: a blocked SIGINT no timeout can
        # interrupt, an alarm that kills the engine later.
        for timer, (value, interval) in timers.items():
            signal.setitimer(timer, value, interval)
        signal.pthread_sigmask(signal.SIG_SETMASK, mask)
        sys.argv[:] = argv
        sys.path[:] = path
        os.chdir(cwd)
        for key in set(os.environ) - set(environ):
            del os.environ[key]
        os.environ.update({k: v for k, v in environ.items() if os.environ.get(k) != v})
        if torch.get_num_threads() != threads:
            torch.set_num_threads(threads)
        for sig, handler in handlers.items():
            if handler is not None and signal.getsignal(sig) is not handler:
                signal.signal(sig, handler)
        _forget_modules(set(sys.modules) - modules, folder)


def _forget_modules(new: set[str], folder: str) -> None:
    prefix = os.path.join(os.path.realpath(folder), "")
    for name in new:
        file = getattr(sys.modules.get(name), "__file__", None)
        if file and os.path.realpath(file).startswith(prefix):
            del sys.modules[name]


@contextmanager
def _exit_handlers() -> Iterator[list[tuple[Callable[..., Any], tuple[Any, ...], dict]]]:
    """Collect the ``atexit.register`` calls the script makes (not those of a module being
    imported, which stay registered for the process's exit)."""
    handlers: list[tuple[Callable[..., Any], tuple[Any, ...], dict]] = []
    real_register, real_unregister = atexit.register, atexit.unregister

    def register(func: Callable[..., Any], *args: Any, **kwargs: Any) -> Callable[..., Any]:
        if _importing():
            return real_register(func, *args, **kwargs)
        handlers.append((func, args, kwargs))
        return func

    def unregister(func: Callable[..., Any]) -> None:
        handlers[:] = [h for h in handlers if h[0] != func]
        real_unregister(func)

    atexit.register, atexit.unregister = register, unregister  # type: ignore[assignment]
    try:
        yield handlers
    finally:
        atexit.register, atexit.unregister = real_register, real_unregister  # type: ignore[assignment]


def _importing() -> bool:
    """Whether the caller runs inside an ``import`` (a module's top level)."""
    frame = sys._getframe(2)
    while frame is not None:
        if frame.f_code.co_filename.startswith("<frozen importlib"):
            return True
        frame = frame.f_back  # type: ignore[assignment]
    return False


def _run_handlers(handlers: list[tuple[Callable[..., Any], tuple[Any, ...], dict]]) -> None:
    """Last registered first; a failing handler is reported and the others still run,
    as at a process's exit."""
    while handlers:
        func, args, kwargs = handlers.pop()
        try:
            func(*args, **kwargs)
        except Exception:
            print(f"Exception ignored in atexit callback {func!r}:", file=sys.stderr)
            traceback.print_exc()


@contextmanager
def _own_groups() -> Iterator[None]:
    """Destroy, at the end, the process groups the script created (not the default)."""
    import torch.distributed as dist

    before = set(_groups()) if dist.is_initialized() else set()
    try:
        yield
    finally:
        if dist.is_initialized():
            destroy = group_guard.original("destroy_process_group")
            for group in set(_groups()) - before:
                if group != dist.GroupMember.WORLD:
                    try:
                        destroy(group)
                    except Exception:  # already gone with a failure: nothing to free
                        continue


def _groups() -> list[Any]:
    from torch.distributed.distributed_c10d import _world

    return list(_world.pg_names)
