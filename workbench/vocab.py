"""One vocabulary for what runs (``parallel/``) and what is predicted (``planner/``).

The planner's names are the canonical ones: precision, optimizer, pipeline schedule,
activation recompute and ZeRO stage. The runtime runs a subset of them; where the runtime's
own spelling differs (``precision="bf16"`` is bf16 autocast with fp32 master weights, i.e.
``bf16-mixed``; ``optimizer="sgd"`` is SGD with momentum 0.9) the mapping is written here
once, so a measured run and its plan always mean the same thing.
"""

from __future__ import annotations

__all__ = [
    "OPTIMIZERS",
    "PRECISIONS",
    "RECOMPUTE",
    "RUN_OPTIMIZERS",
    "RUN_PRECISIONS",
    "RUN_SCHEDULES",
    "RUN_ZERO_STAGES",
    "SCHEDULES",
    "ZERO_STAGES",
    "planner_name",
]

# Everything the planner can predict.
PRECISIONS: tuple[str, ...] = ("fp32", "bf16-mixed")
OPTIMIZERS: tuple[str, ...] = ("adam", "adamw", "sgd", "sgd-momentum")
SCHEDULES: tuple[str, ...] = ("1f1b", "gpipe", "interleaved", "zero_bubble", "zbv", "dualpipe_v")
RECOMPUTE: tuple[str, ...] = ("none", "selective", "full")
ZERO_STAGES: tuple[int, ...] = (0, 1, 2, 3)

# What a workbench run can run, in the runtime's spelling.
RUN_PRECISIONS: tuple[str, ...] = ("fp32", "bf16")
RUN_OPTIMIZERS: tuple[str, ...] = ("sgd", "adamw")
RUN_SCHEDULES: tuple[str, ...] = (
    *("gpipe", "1f1b", "interleaved_1f1b", "zero_bubble", "zbv", "dualpipe_v"),
)
RUN_ZERO_STAGES: tuple[int, ...] = ZERO_STAGES

# Runtime spelling -> planner name, where they differ.
_TO_PLANNER: dict[str, dict[str, str]] = {
    "precision": {"bf16": "bf16-mixed"},
    "optimizer": {"sgd": "sgd-momentum"},  # the runtime's SGD keeps a momentum buffer
    "schedule": {"interleaved_1f1b": "interleaved"},
}


def planner_name(kind: str, runtime_name: str) -> str:
    """The planner's name for a runtime setting (``planner_name("optimizer", "sgd")`` is
    ``"sgd-momentum"``); names that are spelled alike pass through."""
    if kind not in ("precision", "optimizer", "schedule", "recompute"):
        raise ValueError(f"kind={kind!r}; valid: precision, optimizer, schedule, recompute")
    return _TO_PLANNER.get(kind, {}).get(runtime_name, runtime_name)
