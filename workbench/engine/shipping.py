"""Getting the user's own model, data, loss and optimizer factories onto the engines.

A factory is either *shipped*: pickled with cloudpickle on the client (functions and
classes defined in the notebook travel by value, as ipyparallel ships them), or
*referenced by name*: a name in the engines' namespace (defined in a ``%%wb`` cell) or an
import path ``package.module:attr``. Both resolve on the engine with ``resolve``; every
failure names the factory, the rank and the host.

Only what the user handed over is unpickled, and only on the engines the user started.
"""

from __future__ import annotations

import difflib
import functools
import pickle
import socket
import traceback
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from workbench.errors import ConfigError, UserCodeError
from workbench.lazy import import_attr

__all__ = ["Shipped", "guard", "resolve", "ship"]

ROLES = ("model", "data", "loss", "optimizer")


@dataclass(frozen=True, slots=True)
class Shipped:
    """One factory on its way to the engines: pickled bytes or a name to look up there."""

    role: str
    label: str
    payload: bytes | None = None
    name: str | None = None
    # ``package.module:attr`` when the object can be imported by that name (a batch job
    # exported from the notebook rebuilds the run from it); None for notebook code.
    import_path: str | None = None

    def __repr__(self) -> str:
        how = f"{len(self.payload)} bytes" if self.payload is not None else "by name"
        return f"Shipped({self.role}={self.label!r}, {how})"


def _label(obj: Any) -> str:
    name = getattr(obj, "__qualname__", None) or getattr(obj, "__name__", None)
    return str(name) if name else type(obj).__name__


def ship(role: str, obj: Any) -> Shipped:
    """Pack ``obj`` for the engines (a str is a name there, or ``module:attr``)."""
    if isinstance(obj, str):
        name = obj.strip()
        module, _, attr = name.partition(":")
        valid = all(p.isidentifier() for p in module.split(".")) and (
            not attr or all(p.isidentifier() for p in attr.split("."))
        )
        if not name or not valid:
            raise ConfigError(
                f"{role}={obj!r} is not valid; give a callable, a name defined on the engines "
                "(in a %%wb cell) or an import path 'package.module:attr'"
            )
        return Shipped(role=role, label=name, name=name, import_path=name if ":" in name else None)
    import cloudpickle

    try:
        payload = cloudpickle.dumps(obj)
    except Exception as exc:
        label = _label(obj)
        raise ConfigError(
            f"{role}={label} cannot be shipped to the engines: {type(exc).__name__}: {exc}. "
            "It (or something it refers to) cannot be pickled, e.g. an open file, a lock, a "
            "process group or a CUDA tensor. Define it in a %%wb cell and pass its name "
            f"({role}='{label}'), or build such objects inside the factory."
        ) from None
    return Shipped(role=role, label=_label(obj), payload=payload, import_path=_import_path(obj))


def _import_path(obj: Any) -> str | None:
    """``module:qualname`` when importing that gives back ``obj`` itself: not for code of
    ``__main__`` (the notebook), lambdas, nested functions or instances."""
    module = getattr(obj, "__module__", None)
    qualname = getattr(obj, "__qualname__", None)
    if not module or not qualname or module == "__main__" or "<" in qualname:
        return None
    try:
        found = import_attr(module, qualname)
    except (ImportError, AttributeError):
        return None
    return f"{module}:{qualname}" if found is obj else None


def _where() -> str:
    import torch.distributed as dist

    rank = dist.get_rank() if dist.is_initialized() else 0
    return f"rank {rank} (host {socket.gethostname()})"


def resolve(shipped: Shipped, namespace: dict[str, Any]) -> Any:
    """The object on this engine: unpickled, looked up in ``namespace`` or imported."""
    if shipped.payload is not None:
        try:
            return pickle.loads(shipped.payload)  # the user's own object, pickled by us
        except Exception as exc:
            raise UserCodeError(
                f"the {shipped.role} {shipped.label!r} could not be unpickled on {_where()}: "
                f"{type(exc).__name__}: {exc}; a module it needs may be missing on the "
                "engines (install it there, or define the code in a %%wb cell)"
            ) from None
    name = shipped.name or ""
    if ":" in name:
        module_name, _, attr = name.partition(":")
        try:
            obj = import_attr(module_name, attr)
        except (ImportError, AttributeError) as exc:
            raise UserCodeError(
                f"the {shipped.role} {name!r} could not be imported on {_where()}: {exc}"
            ) from None
        return obj
    if name not in namespace:
        known = [k for k, v in namespace.items() if not k.startswith("_") and callable(v)]
        near = difflib.get_close_matches(name, known, n=5, cutoff=0.5)
        raise UserCodeError(
            f"the {shipped.role} {name!r} is not defined on {_where()}; define it in a %%wb "
            f"cell first (nearest names there: {near or 'none'}) or pass the object itself"
        )
    return namespace[name]


def guard(role: str, label: str, fn: Callable[..., Any]) -> Callable[..., Any]:
    """``fn`` whose failures say which factory failed where, with its own traceback."""

    @functools.wraps(fn)
    def guarded(*args: Any, **kwargs: Any) -> Any:
        try:
            return fn(*args, **kwargs)
        except UserCodeError:
            raise
        except Exception as exc:
            tb = "".join(traceback.format_exception(exc)[1:])  # drop the header line
            raise UserCodeError(
                f"the {role} {label!r} raised {type(exc).__name__}: {exc} on {_where()}\n{tb}"
            ) from None

    return guarded
