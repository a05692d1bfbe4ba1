"""Checkpoints of a ``TrainStep``: saved and loaded with torch.distributed.checkpoint, all
ranks or none, signed and verified before anything is read.

One concern, one file each: ``save_load`` (the three collective entry points), ``layout``
(directory names), ``meta`` (meta.json and RNG states), ``write`` (atomic commit, pruning),
``trust`` (the key and the signed manifest), ``verify`` (every check before a load),
``reader`` / ``unpickler`` (DCP reads with no arbitrary unpickling), ``steps`` (a failure
on one rank raised on all).

The names below load on first use: the kernel reads the trust key (``trust``) without
importing torch.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from workbench.lazy import lazy_getattr

if TYPE_CHECKING:
    from workbench.parallel.checkpoint.layout import list_checkpoints
    from workbench.parallel.checkpoint.save_load import load_checkpoint, save_checkpoint

# name -> module that defines it; resolved on first attribute access.
_LAZY: dict[str, str] = {
    "list_checkpoints": "workbench.parallel.checkpoint.layout",
    "load_checkpoint": "workbench.parallel.checkpoint.save_load",
    "save_checkpoint": "workbench.parallel.checkpoint.save_load",
}

__all__ = ["list_checkpoints", "load_checkpoint", "save_checkpoint"]

__getattr__ = lazy_getattr(__name__, _LAZY, globals())
