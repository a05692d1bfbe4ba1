"""Activation checkpointing for the user's own model: which blocks, and switching them on.

``checkpointing=True`` recomputes the blocks FSDP wraps one by one (the children of the
model's largest ``ModuleList`` / ``ModuleDict``, ``parallelize.fsdp_blocks``); a name
pattern (``"blocks.*"``, ``*`` = one path element, as in a TP plan), a module class, or a
list of them choose the blocks instead. Each chosen block's ``forward`` is replaced on the
instance by one that runs the original under ``torch.utils.checkpoint`` (non-reentrant), so
module paths, state-dict keys and TP plans stay as they were (a ``CheckpointWrapper`` would
add a path element), and FSDP's hooks, which run around ``__call__``, still gather the
block's parameters before it runs and again before its backward recomputes it.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Sequence
from typing import Any

import torch
from torch import nn
from torch.utils.checkpoint import checkpoint

from workbench.errors import ConfigError
from workbench.parallel.parallelize import fsdp_blocks
from workbench.parallel.tp_plan import _nearest, matching_modules

__all__ = [
    "Checkpointing",
    "apply_user_checkpointing",
    "check_checkpointing",
    "checkpoint_blocks",
    "describe",
]

# False / True, or the blocks: name patterns and module classes.
Checkpointing = bool | str | type | tuple[str | type, ...]

_HELP = (
    "give True (the repeated blocks FSDP wraps), False, a module name pattern such as "
    "'blocks.*', a module class, or a list of them"
)


def check_checkpointing(value: Any) -> Checkpointing:
    """``value`` as the option holds it (a list becomes a tuple), or a ConfigError."""
    if isinstance(value, bool | str) or _is_module_class(value):
        if isinstance(value, str) and not value:
            raise ConfigError(f"checkpointing={value!r} is not valid; {_HELP}")
        return value  # type: ignore[no-any-return]
    if isinstance(value, list | tuple) and value:
        bad = [v for v in value if not (isinstance(v, str) and v) and not _is_module_class(v)]
        if not bad:
            return tuple(value)
    raise ConfigError(f"checkpointing={value!r} is not valid; {_HELP}")


def _is_module_class(value: Any) -> bool:
    return isinstance(value, type) and issubclass(value, nn.Module)


def checkpoint_blocks(model: nn.Module, value: Checkpointing) -> list[str]:
    """The names of the modules ``value`` chooses in ``model`` (none for False); a pattern
    or class that matches nothing is an error naming the nearest module names."""
    if value is False:
        return []
    names = {id(m): n for n, m in model.named_modules()}
    if value is True:
        found = [names[id(b)] for b in fsdp_blocks(model) if id(b) in names]
        if not found:
            raise ConfigError(
                f"checkpointing=True found no repeated blocks (no ModuleList or ModuleDict) "
                f"in {type(model).__name__}; name the blocks: checkpointing='layers.*' or a "
                "module class"
            )
        return found
    chosen: list[str] = []
    for item in value if isinstance(value, tuple) else (value,):
        if isinstance(item, str):
            hits = matching_modules(model, item)
            hint = f"nearest module names: {_nearest(model, item)}"
        else:
            hits = [n for n, m in model.named_modules() if isinstance(m, item)]
            hint = f"{type(model).__name__} has no {item.__name__} module"
        if not hits:
            raise ConfigError(f"checkpointing: {item!r} matches no module of the model; {hint}")
        chosen += [n for n in hits if n not in chosen]
    return chosen


def apply_user_checkpointing(model: nn.Module, value: Checkpointing) -> list[str]:
    """Recompute each chosen block in backward; returns the blocks' names. A block nested
    in another chosen block is left alone (the outer one recomputes it already)."""
    names = checkpoint_blocks(model, value)
    outer = [n for n in names if not any(n.startswith(o + ".") for o in names if o != n)]
    for name in outer:
        block = model.get_submodule(name)
        block.forward = _recomputed(block.forward)  # type: ignore[method-assign]
    return outer


def _recomputed(forward: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(forward)
    def run(*args: Any, **kwargs: Any) -> Any:
        if not torch.is_grad_enabled():  # nothing is saved for a backward: nothing to trade
            return forward(*args, **kwargs)
        return checkpoint(forward, *args, use_reentrant=False, **kwargs)

    return run


def describe(value: Checkpointing) -> str:
    """A label for tables: 'off', 'blocks', or the patterns / classes given."""
    if value is False:
        return "off"
    if value is True:
        return "blocks"
    items: Sequence[str | type] = value if isinstance(value, tuple) else (value,)
    return ",".join(i if isinstance(i, str) else i.__name__ for i in items)
