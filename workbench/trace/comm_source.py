"""Who issued a collective: a ``labelled`` block, else the Python call stack at issue
time (``comm.CommTracer`` names each recorded collective's source with ``issuer``)."""

from __future__ import annotations

import contextlib
import os
import sys
import threading
from collections.abc import Iterator
from typing import Any

import torch

__all__ = ["issuer", "labelled"]

_TORCH_DIR = os.path.dirname(torch.__file__) + os.sep
_TRACE_DIR = os.path.dirname(__file__) + os.sep
_WORKBENCH_DIR = os.path.dirname(os.path.dirname(__file__)) + os.sep  # trace/'s package
# Where a collective was issued from, by the innermost torch package on the stack.
_SOURCES = tuple(
    (os.path.join(_TORCH_DIR, *parts) + os.sep, name)
    for parts, name in (
        (("distributed", "tensor"), "dtensor"),
        (("distributed", "fsdp"), "fsdp"),
        (("distributed", "pipelining"), "pipeline"),
        (("distributed", "optim"), "zero"),
        (("nn", "parallel"), "ddp"),
    )
)


# A source named by the issuing code itself (``labelled``), per thread.
_LABEL = threading.local()


@contextlib.contextmanager
def labelled(source: str) -> Iterator[None]:
    """Collectives issued on this thread inside the block are recorded with ``source``."""
    previous = getattr(_LABEL, "source", None)
    _LABEL.source = source
    try:
        yield
    finally:
        _LABEL.source = previous


# The autograd engine's Python entry points: a collective whose innermost Python frame is
# one of these was issued by C++ code running backward (DDP's reducer).
_AUTOGRAD_ENGINE = tuple(
    os.path.join(_TORCH_DIR, "autograd", name) for name in ("graph.py", "__init__.py")
)


def issuer(ddp_bucket: bool = False) -> str:
    """Who issued the collective: a ``labelled`` block, else the first frame outside
    torch's plumbing decides. ``ddp_bucket``: the collective may be a DDP gradient bucket
    (a floating-point all-reduce); it is one when no Python code issued it inside
    backward (the innermost frame is the autograd engine's entry, or there is no frame at
    all: an autograd device thread)."""
    label = getattr(_LABEL, "source", None)
    if label is not None:
        return str(label)
    frame: Any = sys._getframe(1)
    innermost = True
    while frame is not None:
        filename = frame.f_code.co_filename
        if filename.startswith(_TRACE_DIR):
            frame = frame.f_back
            continue
        if innermost and ddp_bucket and filename.startswith(_AUTOGRAD_ENGINE):
            return "ddp-bucket"
        innermost = False
        if filename.startswith(_TORCH_DIR):
            for prefix, name in _SOURCES:
                if filename.startswith(prefix):
                    return name
        elif filename.startswith(_WORKBENCH_DIR):
            return "workbench"
        else:
            return "user"
        frame = frame.f_back
    return "ddp-bucket" if ddp_bucket and innermost else "user"
