"""The small files of a checkpoint: ``meta.json`` and each rank's RNG state.

Both are checked completely here, before a load touches the run, so a load never fails
half-way on a missing field or a bad RNG file after the weights were already replaced.
"""

from __future__ import annotations

import io
import json
import math
import random
from dataclasses import asdict
from typing import Any

import torch

from workbench.errors import CheckpointError

__all__ = [
    "FORMAT",
    "RngState",
    "check_same_model",
    "make_meta",
    "param_shapes",
    "parse_meta",
    "parse_rng",
    "rng_state",
    "set_rng_state",
]

FORMAT = 1

# (torch tensors {"cpu": ByteTensor, "cuda": [ByteTensor, ...]}, Python ``random`` state)
RngState = tuple[dict[str, Any], dict[str, Any]]


def make_meta(
    train_step: Any, world: int, params: dict[str, list[int]] | None = None
) -> dict[str, Any]:
    """``params``: every parameter's full (unsharded) shape by name, so a load can tell a
    different model from this one before reading any weight."""
    spec = train_step.spec
    describe = getattr(spec, "checkpoint_fields", None)  # a user run: its JSON description
    spec_fields = describe() if callable(describe) else asdict(spec) if spec is not None else None
    return {
        "format": FORMAT,
        "step": train_step.step,
        "data_position": train_step.data_position,
        "last_loss": train_step.last_loss,
        "strategy": train_step.strategy,
        "world_size": world,
        "model": spec_fields["model"] if spec_fields else None,
        "spec": spec_fields,
        "params": params,
    }


def _whole(value: Any, least: int) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= least


def _shapes_or_none(value: Any) -> bool:
    return value is None or (
        isinstance(value, dict)
        and all(
            isinstance(k, str) and isinstance(v, list) and all(_whole(d, 0) for d in v)
            for k, v in value.items()
        )
    )


def param_shapes(model_state: dict[str, Any]) -> dict[str, list[int]]:
    """Name -> full shape of every tensor in a model state dict (a DTensor's ``shape`` is
    its global one, so every layout of one model gives the same answer)."""
    return {k: list(v.shape) for k, v in model_state.items() if isinstance(v, torch.Tensor)}


def check_same_model(
    saved: dict[str, list[int]] | None, here: dict[str, list[int]], where: str
) -> None:
    """A clear error when the checkpoint holds a different model than the run."""
    if saved is None or saved == here:
        return
    missing = sorted(set(here) - set(saved))
    extra = sorted(set(saved) - set(here))
    shapes = [
        f"{n} (checkpoint {saved[n]}, this run {here[n]})"
        for n in sorted(set(saved) & set(here))
        if saved[n] != here[n]
    ]
    parts = []
    if shapes:
        parts.append(f"shapes differ: {', '.join(shapes[:5])}")
    if missing:
        parts.append(f"not in the checkpoint: {missing[:5]}")
    if extra:
        parts.append(f"not in this run's model: {extra[:5]}")
    raise CheckpointError(
        f"the checkpoint at {where} holds a different model than this run ({len(saved)} "
        f"tensors saved, {len(here)} here); {'; '.join(parts)}; load it into a run of the "
        "model it was saved from"
    )


def parse_meta(data: bytes, where: str) -> dict[str, Any]:
    """``meta.json`` with every field the load uses present and of the right type."""
    name = f"meta.json of the checkpoint at {where}"
    try:
        meta = json.loads(data)
    except RecursionError:  # nested deeper than the parser's stack: no meta.json of ours
        raise CheckpointError(f"{name} is nested too deeply to be a checkpoint's") from None
    except ValueError as exc:
        raise CheckpointError(f"{name} is not JSON: {exc}") from None
    if not isinstance(meta, dict):
        raise CheckpointError(f"{name} is not a JSON object")
    fields: dict[str, tuple[Any, str]] = {
        "format": (lambda v: v == FORMAT, f"format {FORMAT}"),
        "step": (lambda v: _whole(v, 0), "an integer >= 0"),
        "data_position": (lambda v: _whole(v, 0), "an integer >= 0"),
        "world_size": (lambda v: _whole(v, 1), "an integer >= 1"),
        "strategy": (lambda v: isinstance(v, str), "a string"),
        "last_loss": (
            lambda v: (
                v is None
                or (isinstance(v, int | float) and not isinstance(v, bool) and math.isfinite(v))
            ),
            "a finite number or null",
        ),
        "model": (lambda v: v is None or isinstance(v, str), "a string or null"),
        "spec": (lambda v: v is None or isinstance(v, dict), "an object or null"),
        "params": (_shapes_or_none, "an object of name -> shape (list of integers), or null"),
    }
    optional = {"last_loss", "model", "spec", "params"}
    for field, (valid, expected) in fields.items():
        if field not in meta:
            if field in optional:
                continue
            raise CheckpointError(f"{name}: field {field!r} is missing; it must be {expected}")
        if not valid(meta[field]):
            raise CheckpointError(
                f"{name}: field {field!r} is {meta[field]!r}; it must be {expected}"
            )
    return meta


def rng_state() -> RngState:
    tensors: dict[str, Any] = {"cpu": torch.get_rng_state()}
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        tensors["cuda"] = torch.cuda.get_rng_state_all()
    version, internal, gauss = random.getstate()
    py = {"version": version, "state": list(internal), "gauss": gauss}
    return tensors, {**py, "numpy": _numpy_state()}


def _numpy_state() -> dict[str, Any]:
    """numpy's global generator (seeded with the run, ``seeding``) as JSON."""
    import numpy

    kind, keys, pos, has_gauss, cached = numpy.random.get_state()
    return {
        "kind": kind,
        "keys": keys.tolist(),
        "pos": pos,
        "has_gauss": has_gauss,
        "cached": cached,
    }


def _set_numpy_state(state: dict[str, Any], target: Any = None) -> None:
    """Apply a ``_numpy_state`` to ``target`` (a ``RandomState``; default the global one)."""
    import numpy

    keys = numpy.asarray(state["keys"], dtype=numpy.uint32)
    value = (
        state["kind"],
        keys,
        int(state["pos"]),
        int(state["has_gauss"]),
        float(state["cached"]),
    )
    (target if target is not None else numpy.random).set_state(value)


def parse_rng(pt: bytes, js: bytes, name: str, where: str) -> RngState:
    """A rank's RNG files, checked by applying them to throw-away generators (the same
    checks ``set_rng_state`` would do, without touching the live ones)."""
    try:
        tensors = torch.load(io.BytesIO(pt), weights_only=True)
        if not isinstance(tensors, dict) or not isinstance(tensors.get("cpu"), torch.Tensor):
            raise ValueError("no 'cpu' generator state")
        torch.Generator().set_state(tensors["cpu"])
        cuda = tensors.get("cuda", [])
        if not isinstance(cuda, list | tuple) or not all(
            isinstance(t, torch.Tensor) and t.dtype == torch.uint8 for t in cuda
        ):
            raise ValueError("'cuda' is not a list of generator states")
    except Exception as exc:
        raise CheckpointError(
            f"{name}.pt of the checkpoint at {where} is not a valid torch RNG state: "
            f"{type(exc).__name__}: {exc}"
        ) from None
    try:
        py = json.loads(js)
        state = (py["version"], tuple(py["state"]), py["gauss"])
        random.Random().setstate(state)
        if "numpy" in py:  # absent in checkpoints written before runs seeded numpy
            import numpy

            _set_numpy_state(py["numpy"], numpy.random.RandomState())
    except Exception as exc:
        raise CheckpointError(
            f"{name}.json of the checkpoint at {where} is not a valid Python random "
            f"state: {type(exc).__name__}: {exc}"
        ) from None
    return tensors, py


def set_rng_state(tensors: dict[str, Any], py: dict[str, Any]) -> None:
    torch.set_rng_state(tensors["cpu"])
    if tensors.get("cuda") and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(tensors["cuda"])
    random.setstate((py["version"], tuple(py["state"]), py["gauss"]))
    if "numpy" in py:
        _set_numpy_state(py["numpy"])
