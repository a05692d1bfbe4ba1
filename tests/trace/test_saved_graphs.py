"""The tracer keeps a saved tensor, and its graph, exactly as long as autograd would.

An op that saves its own output (exp, softmax, tanh) hands the pack hook a tensor whose
``grad_fn`` owns the handle; a handle holding that tensor made a cycle through C++ that
Python's gc cannot break, so a forward dropped without backward (torch pipelining's
metadata-inference forward, an evaluation with grad on) stayed alive and counted. Each test
here compares against the same code run untraced, and fails on a handle that holds the
graph.
"""

from __future__ import annotations

import gc
import weakref
from collections.abc import Callable, Iterator
from contextlib import contextmanager

import pytest
import torch
from torch import nn

from workbench.trace import MemoryTracer, Recorder


class SavesItsOutputs(nn.Module):
    """Every kind of save: inputs (linear), outputs (exp, softmax, tanh), both (GELU)."""

    def __init__(self, device: str = "cpu") -> None:
        super().__init__()
        self.a = nn.Linear(16, 32, device=device)
        self.b = nn.Linear(32, 16, device=device)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = nn.functional.gelu(self.a(x)).exp()
        return torch.tanh(self.b(h.softmax(-1)))


class Tagged(torch.Tensor):
    """A tensor subclass (the pack hook's other path, the one DTensors take)."""


@contextmanager
def _gc_off() -> Iterator[None]:
    """Freed by reference counting alone, as untraced: no collection may run meanwhile."""
    was = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was:
            gc.enable()


def _dropped_forward(model: nn.Module, x: torch.Tensor, traced: bool) -> tuple[bool, int]:
    """(is the output still alive after its last reference went, activation bytes then)."""
    tracer = MemoryTracer(model, None, Recorder())
    with _gc_off():
        if traced:
            tracer.start()
        try:
            out = model(x)  # grad on, never backpropagated
            assert out.grad_fn is not None
            ref = weakref.ref(out)
            if traced:
                assert tracer.activation_bytes > 0 or x.is_meta
            del out
            return ref() is not None, tracer.activation_bytes
        finally:
            tracer.stop()


@pytest.mark.parametrize(
    ("device", "wrap"),
    [
        ("cpu", lambda t: t),
        ("meta", lambda t: t),  # no memory, but the graph is an object all the same
        ("cpu", lambda t: t.as_subclass(Tagged)),
    ],
    ids=["plain", "meta", "subclass"],
)
def test_a_forward_dropped_without_backward_is_freed_at_once(
    device: str, wrap: Callable[[torch.Tensor], torch.Tensor]
) -> None:
    torch.manual_seed(0)
    model = SavesItsOutputs(device)
    x = wrap(torch.randn(8, 16, device=device))
    assert _dropped_forward(model, x, traced=False) == (False, 0)  # what autograd does
    assert _dropped_forward(model, x, traced=True) == (False, 0)


def test_repeated_dropped_forwards_do_not_accumulate() -> None:
    """The pipeline case: one dropped forward per build, then ordinary steps; the count
    after each backward is zero, not the dropped forward's bytes."""
    torch.manual_seed(0)
    model = SavesItsOutputs()
    x = torch.randn(8, 16)
    with MemoryTracer(model, None, Recorder()) as tracer:
        for _ in range(3):
            model(x)  # dropped at once
            assert tracer.activation_bytes == 0
            model(x).sum().backward()
            assert tracer.activation_bytes == 0


def test_gradients_are_the_untraced_ones_to_the_bit() -> None:
    """Handles hold each saved tensor without its graph; autograd reattaches it on unpack,
    so backward, double backward included, computes exactly what it computes untraced."""
    torch.manual_seed(0)
    model = SavesItsOutputs()
    x = torch.randn(8, 16, requires_grad=True)

    def grads(traced: bool) -> list[torch.Tensor]:
        model.zero_grad()
        tracer = MemoryTracer(model, None, Recorder())
        if traced:
            tracer.start()
        try:
            (gx,) = torch.autograd.grad(model(x).square().sum(), x, create_graph=True)
            gx.square().sum().backward()
        finally:
            tracer.stop()
        return [gx.detach(), *(p.grad.clone() for p in model.parameters() if p.grad is not None)]

    untraced, traced = grads(False), grads(True)
    assert len(traced) == len(untraced) == 5
    for a, b in zip(traced, untraced, strict=True):
        assert torch.equal(a, b)
