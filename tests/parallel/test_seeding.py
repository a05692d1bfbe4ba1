"""Every run is seeded on every rank from its ``seed`` (torch, numpy, ``random``), so a run
with dropout gives the same losses whatever the ranks drew before it; what equals what
with dropout on is what the README's *Reproducible runs* says: ``single`` the reference
bit for bit, DDP and FSDP each other (the same masks per data-parallel rank), tensor
parallel the reference (every rank draws the whole activation's mask), data parallel not
the reference (each rank draws a mask for its own rows). A checkpoint resumes the stream."""

from __future__ import annotations

import random
from pathlib import Path
from typing import Any

import numpy
import pytest
import torch

from tests.harness import run_ranks
from tests.parallel import _user_models as um
from workbench.errors import ConfigError
from workbench.parallel.checkpoint import load_checkpoint, save_checkpoint
from workbench.parallel.parallelize import Layout
from workbench.parallel.seeding import MAX_SEED
from workbench.parallel.user_model import UserRun, build_user_train_step, user_reference

STEPS, SAVE_AT, TOL = 4, 2, 1e-5


def noisy_loss(logits: Any, targets: torch.Tensor) -> torch.Tensor:
    """The model's loss plus draws from Python's and numpy's generators (a user's loss or
    augmentation may draw from either): equal run to run only when both are seeded."""
    return um.lm_loss(logits, targets) + 1e-3 * (random.random() + float(numpy.random.rand()))


def _run(layout: dict[str, Any], *, dropout: bool = True, seed: int = 0, **kw: Any) -> UserRun:
    return UserRun(
        model=um.make_dropout_model if dropout else um.make_model,
        data=um.make_data,
        loss=noisy_loss,
        optimizer=um.adamw,
        layout=Layout(**layout),
        trace=False,
        seed=seed,
        **kw,
    )


def _losses(run: UserRun, steps: int = STEPS) -> list[float]:
    step = build_user_train_step(run)
    return [step.run_step() for _ in range(steps)]


def _draw_unevenly(rank: int) -> None:
    """What a notebook's cells do between runs: each rank draws a different amount."""
    torch.rand(3 + 5 * rank)
    random.random()
    numpy.random.rand(2 + rank)


def _seeded_runs(rank: int, world: int) -> dict[str, list[float]]:
    out: dict[str, list[float]] = {}
    _draw_unevenly(rank)
    out["dp"] = _losses(_run({"zero": 0}))
    _draw_unevenly(rank)
    out["dp again"] = _losses(_run({"zero": 0}))
    out["dp seed 1"] = _losses(_run({"zero": 0}, seed=1))
    out["fsdp"] = _losses(_run({"zero": 3}))
    out["tp"] = _losses(_run({"dp": 1, "tp": 2, "tp_plan": um.TP_PLAN}))
    _draw_unevenly(rank)
    out["single"] = _losses(_run({}, strategy="single"))  # one device, inside the group
    out["reference"] = user_reference(_run({}), STEPS)[0]
    out["dp no dropout"] = _losses(_run({"zero": 0}, dropout=False))
    out["reference no dropout"] = user_reference(_run({}, dropout=False), STEPS)[0]
    return out


def _gap(a: list[float], b: list[float]) -> float:
    return max(abs(x - y) for x, y in zip(a, b, strict=True))


@pytest.mark.engines
def test_seeded_runs_with_dropout_repeat_and_match_what_the_readme_says() -> None:
    ranks = run_ranks(_seeded_runs, timeout=300)
    r = ranks[0]
    for name in r:
        print(f"{name:>22}: {[round(x, 6) for x in r[name]]}")
    assert ranks[1] == r, "every rank reports the same (global-batch) losses"
    # The same seed, the same numbers, whatever the ranks drew before the run.
    assert r["dp again"] == r["dp"]
    assert r["dp seed 1"] != r["dp"]
    # One device: the single run on rank 0 of the group is the reference, bit for bit.
    assert r["single"] == r["reference"]
    # DDP and FSDP draw the same masks (the same seed on every data-parallel rank).
    assert _gap(r["fsdp"], r["dp"]) <= TOL
    # Tensor parallel: every rank draws the whole activation's mask, as one device does.
    assert _gap(r["tp"], r["reference"]) <= TOL
    # Data parallel with dropout is not the single device (a mask per rank's rows) ...
    assert _gap(r["dp"], r["reference"]) > 1e-3
    # ... and is without it.
    assert _gap(r["dp no dropout"], r["reference no dropout"]) <= TOL


def _resume(rank: int, world: int, root: str, layout: dict[str, Any]) -> dict[str, list[float]]:
    uninterrupted = _losses(_run(layout), steps=STEPS)
    first = build_user_train_step(_run(layout))
    losses = [first.run_step() for _ in range(SAVE_AT)]
    save_checkpoint(first, root)
    first.run_step()  # progress after the save, which the load must not see
    _draw_unevenly(rank)
    resumed = build_user_train_step(_run(layout))
    load_checkpoint(resumed, root)
    losses += [resumed.run_step() for _ in range(STEPS - SAVE_AT)]
    return {"uninterrupted": uninterrupted, "resumed": losses}


@pytest.mark.engines
@pytest.mark.parametrize("layout", [{"zero": 0}, {"zero": 3}], ids=["ddp", "fsdp"])
def test_a_resumed_run_with_dropout_equals_the_uninterrupted_one(
    tmp_path: Path, layout: dict[str, Any]
) -> None:
    r = run_ranks(_resume, str(tmp_path / "ckpt"), layout, timeout=300)[0]
    print(r)
    assert r["resumed"] == r["uninterrupted"]


@pytest.mark.parametrize("seed", [-1, MAX_SEED + 1, 1.0, True, "0"])
def test_a_bad_seed_is_refused_at_the_entry_point(seed: object) -> None:
    with pytest.raises(ConfigError, match=rf"^seed={seed!r} is not valid: "):
        _run({}, seed=seed)  # type: ignore[arg-type]


def test_a_traced_loop_is_seeded_when_asked() -> None:
    from workbench.engine.traced import traced

    def draws(seed: int | None) -> tuple[float, float, float]:
        _draw_unevenly(3)
        with traced(seed=seed):
            return float(torch.rand(1)), random.random(), float(numpy.random.rand())

    assert draws(7) == draws(7)
    assert draws(None) != draws(None)  # without seed= the generators run on
    with pytest.raises(ConfigError, match=r"^seed=-1 is not valid: "):
        traced(seed=-1)
