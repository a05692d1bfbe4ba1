"""Process-wide dispatcher interception of collectives, at zero cost for every other op.

Every collective reaches the PyTorch dispatcher as a ``c10d::*`` or ``_c10d_functional::*``
op (``torch.distributed`` calls, DDP's reducer, FSDP2, DTensor redistributions, functional
collectives); the op tables come from ``c10d_ops``. Instead of a ``TorchDispatchMode``
(which routes *every* op of the program through Python: about 9 us per op here, +27% on a
small transformer step), a Python kernel is registered for just these ops at the
``BackendSelect`` dispatch key, which every call passes before its backend kernel. The
kernel reports the call to the listeners and redispatches to the real (gloo / NCCL)
kernel below ``BackendSelect``.

The kernels are registered when the first listener arrives and then stay, *parked*, when
the last one leaves: a loop traced block by block (``with wb.traced(...)`` around every
step) would otherwise register and remove 36 kernels per block (0.3-1 ms, the dispatcher
rebuilds each op's table). A parked kernel records nothing: it sees no listener and
redispatches at once (one Python call per collective, ~10 us; nothing per other op).
``release()`` removes them and restores the dispatcher exactly: called when tracing is
turned off for good (an engine's status monitor stopped, interpreter exit), or by anyone
who wants the dispatcher back (their own ``BackendSelect`` kernel on a collective).
Removal is never done from inside a kernel or on a timer thread: the dispatcher holds a
raw pointer to a kernel while it runs, so a kernel removed mid-call would be freed under it.

Because the registration is per process, collectives issued on any thread (autograd
device threads, pipeline workers) are seen. A collective issued inside another traced
collective (a functional all-reduce runs ``c10d::allreduce_`` underneath) or inside
``looking_away()`` (the DDP hook's own all-reduce) is not reported a second time.
"""

from __future__ import annotations

import atexit
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any, Protocol

import torch

from workbench.trace.c10d_ops import OpInfo, overloads

__all__ = [
    "Listener",
    "active",
    "add_listener",
    "intercepted_ops",
    "looking_away",
    "release",
    "remove_listener",
]


class Listener(Protocol):
    def _on_collective(self, info: OpInfo, call: Callable[[], Any], args: tuple) -> Any: ...

    def _on_wait(self, tensor: Any) -> None: ...


_LOCAL = threading.local()  # .depth > 0: inside a traced collective or looking away
_LOCK = threading.Lock()
_listeners: tuple[Listener, ...] = ()  # replaced, never mutated: kernels read a snapshot
_libraries: list[Any] = []
_registered: list[str] = []


def _depth() -> int:
    return getattr(_LOCAL, "depth", 0)


@contextmanager
def looking_away() -> Iterator[None]:
    """Collectives issued inside this block (on this thread) are not reported."""
    _LOCAL.depth = _depth() + 1
    try:
        yield
    finally:
        _LOCAL.depth -= 1


def _is_meta(args: tuple) -> bool:
    for a in args:
        if isinstance(a, torch.Tensor):
            return a.device.type == "meta"
        if isinstance(a, list | tuple) and a and isinstance(a[0], torch.Tensor):
            return a[0].device.type == "meta"
    return False


def _redispatcher(op: Any) -> Callable[..., Any]:
    """``op.redispatch`` without its Python frame (the kernel runs for every collective,
    parked or not)."""
    handle = getattr(op, "_handle", None)
    return getattr(handle, "redispatch_boxed", None) or op.redispatch


def _collective_kernel(op: Any, info: OpInfo, below: Any) -> Callable[..., Any]:
    redispatch = _redispatcher(op)

    def kernel(keyset: Any, *args: Any, **kwargs: Any) -> Any:
        listeners = _listeners
        if not listeners or _depth() > 0 or _is_meta(args):
            return redispatch(keyset & below, *args, **kwargs)

        def call() -> Any:
            with looking_away():
                return redispatch(keyset & below, *args, **kwargs)

        if len(listeners) == 1:
            return listeners[0]._on_collective(info, call, args)
        # Several tracers: the first issues the op, the others are told about it.
        return _fan_out(listeners, info, call, args)

    return kernel


def _fan_out(listeners: tuple[Listener, ...], info: OpInfo, call: Any, args: tuple) -> Any:
    result: list[Any] = []

    def call_once() -> Any:
        if not result:
            result.append(call())
        return result[0]

    out = None
    for listener in listeners:
        out = listener._on_collective(info, call_once, args)
    return out


def _wait_kernel(op: Any, below: Any) -> Callable[..., Any]:
    redispatch = _redispatcher(op)

    def kernel(keyset: Any, *args: Any, **kwargs: Any) -> Any:
        out = redispatch(keyset & below, *args, **kwargs)
        for listener in _listeners:
            listener._on_wait(args[0] if args else None)
        return out

    return kernel


# (qualified op name, kernel) for every op to intercept: built on first use and kept, so
# that a traced block entered every step pays only for the registrations themselves.
_TARGETS: list[tuple[str, Callable[..., Any]]] = []


def _targets() -> list[tuple[str, Callable[..., Any]]]:
    if not _TARGETS:
        below = torch._C._dispatch_keyset_full_after(torch._C.DispatchKey.BackendSelect)
        targets: list[tuple[Any, Callable[..., Any]]] = [
            (op, _collective_kernel(op, info, below)) for op, info in overloads().items()
        ]
        wait = getattr(torch.ops._c10d_functional, "wait_tensor", None)
        if wait is not None:
            targets += [
                (getattr(wait, n), _wait_kernel(getattr(wait, n), below)) for n in wait.overloads()
            ]
        _TARGETS.extend(
            (op.name(), kernel)  # "ns::op" or "ns::op.overload"
            for op, kernel in targets
            if not torch._C._dispatch_has_kernel_for_dispatch_key(op.name(), "BackendSelect")
        )
    return _TARGETS


def _register() -> None:
    libraries: dict[str, Any] = {}
    for qualified, kernel in _targets():
        namespace, name = qualified.split("::", 1)
        if namespace not in libraries:
            libraries[namespace] = torch.library.Library(namespace, "IMPL")
        try:
            # An existing BackendSelect kernel must not be replaced (the op is then left
            # untraced): one registered in C++ is found once, in _targets; one registered
            # from Python since is refused here.
            libraries[namespace].impl(
                name, kernel, "BackendSelect", with_keyset=True, allow_override=False
            )
        except RuntimeError:
            continue
        _registered.append(qualified)
    _libraries.extend(libraries.values())


def _unregister() -> None:
    for library in _libraries:
        library._destroy()
    _libraries.clear()
    _registered.clear()


def add_listener(listener: Listener) -> None:
    global _listeners
    with _LOCK:
        if listener in _listeners:
            return
        if not _libraries:  # first use, or after release(): otherwise parked kernels wait
            _register()
        _listeners = (*_listeners, listener)


def remove_listener(listener: Listener) -> None:
    """Stop telling ``listener``; the kernels stay parked (see the module docstring)."""
    global _listeners
    with _LOCK:
        if listener in _listeners:
            _listeners = tuple(x for x in _listeners if x is not listener)


def release() -> bool:
    """Remove the parked kernels, restoring the dispatcher exactly; False (and nothing
    removed) while a listener is still active. Call it on the thread that issues the
    collectives, outside any collective."""
    with _LOCK:
        if _listeners:
            return False
        _unregister()
        return True


def intercepted_ops() -> list[str]:
    """Qualified names of the ops whose kernels are registered, parked or active (empty
    before the first tracer and after ``release()``)."""
    return list(_registered)


def active() -> bool:
    """Is any listener told about collectives now? (Parked kernels alone: False.)"""
    return bool(_listeners)


# At exit: the kernels call back into Python, which must not happen during interpreter
# teardown (a collective issued by a destructor there would find half-torn-down modules).
atexit.register(release)
