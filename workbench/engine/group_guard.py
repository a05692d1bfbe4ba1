"""On the engines: the user's ``init_process_group`` adopts the cluster's group, and the
user's ``destroy_process_group()`` leaves it alone.

An engine already holds the cluster's default group, so the first line of a torchrun
script (``dist.init_process_group("gloo")``) would raise torch's "trying to initialize the
default process group twice!". Accelerate (``PartialState``) and Lightning
(``_init_dist_connection``) skip the call when a group exists; plain scripts cannot, so
the two functions are replaced in ``torch.distributed`` and ``distributed_c10d`` (once per
engine, from ``setup_rank``):

- ``init_process_group`` while a group exists returns at once when the call asks for what
  the group is (its backend, its world size, this rank), and otherwise raises one
  ``ConfigError`` naming what was asked for and what the cluster has. Without a group it
  is torch's own function (the workbench's own joins go through it too).
- ``destroy_process_group()`` of the default group does nothing while user code runs: a
  ``%%wb`` cell (IPython's ``pre_execute`` .. ``post_execute``) or a script
  (``script_run``). ``Accelerator.end_training()`` and ``Trainer`` call it, and so does
  the last line of most torchrun scripts; the group is the cluster's, and ``%wb restart``
  is how to rebuild it. Subgroups are destroyed as asked; the workbench's own calls (apply
  requests, never cells) reach torch's function unchanged.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

from workbench.engine.state import engine_state
from workbench.errors import ConfigError

__all__ = ["install", "original", "script_running", "user_code"]

_MARK = "_workbench_adopts"
# torch's own functions before install() replaced them: a process constant (one torch per
# process, patched once), so it stays here rather than in the engine state.
_ORIGINALS: dict[str, Callable[..., Any]] = {}


def original(name: str) -> Callable[..., Any]:
    """Torch's own ``init_process_group`` / ``destroy_process_group``."""
    if name not in _ORIGINALS:
        import torch.distributed.distributed_c10d as c10d

        return getattr(c10d, name)  # type: ignore[no-any-return]
    return _ORIGINALS[name]


def user_code() -> bool:
    """Whether a ``%%wb`` cell or a script is running on this engine now."""
    return engine_state().user_code


@contextmanager
def script_running() -> Iterator[None]:
    """Mark a script's run (``script_run``), also when it was not sent as a cell."""
    state = engine_state()
    state.script_begins()
    try:
        yield
    finally:
        state.script_ends()


def install() -> None:
    """Replace the two functions (idempotent) and follow cells through the shell's events."""
    import torch.distributed as dist
    import torch.distributed.distributed_c10d as c10d

    if not getattr(c10d.init_process_group, _MARK, False):
        _ORIGINALS["init_process_group"] = c10d.init_process_group
        _ORIGINALS["destroy_process_group"] = c10d.destroy_process_group
        for replacement in (_adopting_init, _guarded_destroy):
            setattr(replacement, _MARK, True)
        for module in (dist, c10d):
            module.init_process_group = _adopting_init  # type: ignore[assignment]
            module.destroy_process_group = _guarded_destroy  # type: ignore[assignment]
    _follow_cells()


def _follow_cells() -> None:
    try:
        from IPython import get_ipython

        shell = get_ipython()
    except ImportError:
        return
    if shell is None or getattr(shell, _MARK, False):
        return
    state = engine_state()
    shell.events.register("pre_execute", state.cell_begins)
    shell.events.register("post_execute", state.cell_ends)
    setattr(shell, _MARK, True)


def _adopting_init(*args: Any, **kwargs: Any) -> None:
    import inspect

    import torch.distributed as dist

    init = original("init_process_group")
    if not dist.is_initialized():
        return init(*args, **kwargs)  # type: ignore[no-any-return]
    try:
        call = inspect.signature(init).bind(*args, **kwargs).arguments
    except TypeError:
        return init(*args, **kwargs)  # type: ignore[no-any-return]  # torch's own TypeError
    asked = _asked(call)
    have = {
        "backend": str(dist.get_backend()),
        "world_size": dist.get_world_size(),
        "rank": dist.get_rank(),
    }
    wrong = [key for key, value in asked.items() if value is not None and value != have[key]]
    if not wrong:
        return None
    shown = ", ".join(f"{key}={value!r}" for key, value in asked.items() if value is not None)
    raise ConfigError(
        f"init_process_group({shown}) asks for a process group this cluster does not "
        f"have: the cluster's group is backend={have['backend']!r}, "
        f"world_size={have['world_size']}, and this engine is rank {have['rank']} "
        f"(different: {', '.join(wrong)}). The script runs inside that group: start a "
        "cluster that matches (`%wb start -n N --backend B`) or let the script take the "
        "cluster's (init_process_group() without a backend or world size)"
    )


def _asked(call: dict[str, Any]) -> dict[str, Any]:
    """What the call asks for: its arguments, else (``env://``) the environment."""
    world_size = call.get("world_size", -1)
    rank = call.get("rank", -1)
    from_env = call.get("store") is None
    if world_size in (None, -1) and from_env:
        world_size = _env_int("WORLD_SIZE")
    if rank in (None, -1) and from_env:
        rank = _env_int("RANK")
    return {
        "backend": _backend_name(call.get("backend")),
        "world_size": None if world_size in (None, -1) else int(world_size),
        "rank": None if rank in (None, -1) else int(rank),
    }


def _backend_name(backend: Any) -> str | None:
    """``"gloo"`` for ``"gloo"``, ``"GLOO"``, ``"cpu:gloo"``; None (torch picks) for None or
    "undefined"; a ``"cpu:gloo,cuda:nccl"`` naming two backends stays as it was given."""
    if backend is None:
        return None
    text = str(backend).lower()
    if text == "undefined":
        return None
    names = {part.split(":")[-1] for part in text.split(",")}
    return names.pop() if len(names) == 1 else text


def _env_int(name: str) -> int | None:
    try:
        return int(os.environ[name])
    except (KeyError, ValueError):
        return None


def _guarded_destroy(group: Any = None) -> None:
    import torch.distributed as dist

    if user_code() and dist.is_initialized() and (group is None or group == _world_group()):
        return None  # the cluster's group outlives the cell or script
    return original("destroy_process_group")(group)  # type: ignore[no-any-return]


def _world_group() -> Any:
    from torch.distributed.distributed_c10d import GroupMember

    return GroupMember.WORLD
