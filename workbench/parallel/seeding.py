"""One seed for a run's random draws on every rank: torch (CPU and CUDA), numpy, ``random``.

After torchtitan's ``set_determinism``: every rank of a data- or tensor-parallel group gets
the same seed, and pipeline stages get distinct ones (``seed + stage``), so two runs of
the same notebook draw the same numbers whatever the ranks ran before (a ``%%wb`` cell
that drew random numbers, an earlier run). The model's initial parameters have their own
seeded generator (``build_model`` / ``build_user_model``): this is for what the run draws
while it trains (dropout masks, a loss's sampling, the user's own ``random`` calls).

What that buys, per strategy (README, *Reproducible runs*): the same numbers run to run
under every strategy; data-parallel ranks draw the same masks for *their own* rows, so
with dropout on a data-parallel run matches another data-parallel run of the same size
(DDP against FSDP), not the single device, which draws one mask for the whole batch.
"""

from __future__ import annotations

import random

import torch

__all__ = ["DEFAULT_SEED", "MAX_SEED", "SEED_MODULUS", "rank_seed", "seed_everything"]

# numpy takes seeds below 2**32 (it rejects larger ones); a run's seed is one of those.
SEED_MODULUS = 2**32
MAX_SEED = SEED_MODULUS - 1
# Every run is seeded: the same notebook gives the same numbers unless the user asks otherwise.
DEFAULT_SEED = 0


def rank_seed(seed: int, *, stage: int = 0) -> int:
    """This rank's seed: the run's seed, shifted by its pipeline stage (0 without one)."""
    return (int(seed) + int(stage)) % SEED_MODULUS


def seed_everything(seed: int) -> None:
    """Seed torch (every device), numpy's global generator and Python's ``random``."""
    random.seed(seed)
    torch.manual_seed(seed)  # CUDA generators too, on every device
    try:
        import numpy
    except ImportError:  # pragma: no cover - numpy is a dependency
        return
    numpy.random.seed(seed % SEED_MODULUS)
