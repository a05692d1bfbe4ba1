"""Training options that cut across strategies: activation checkpointing and precision.

Checkpointing is a per-block flag on the workbench models (``torch.utils.checkpoint``,
non-reentrant): module paths stay the same, so TP plans and state-dict keys do not change,
and it composes with FSDP/TP/PP applied afterwards. It trades compute for memory and must
not change the numbers (a test checks it).

Precision ``bf16`` runs the forward under ``torch.autocast`` (FSDP: ``MixedPrecisionPolicy``
with fp32 gradient reduction instead). Where bf16 cannot run, ``check_precision`` raises a
ConfigError before any work starts.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import torch
from torch import nn

from workbench.errors import ConfigError, choices_error
from workbench.vocab import RUN_PRECISIONS

__all__ = ["PRECISIONS", "apply_checkpointing", "autocast", "check_precision", "compute_dtype"]

PRECISIONS = RUN_PRECISIONS  # the runtime's spelling; see workbench.vocab


def apply_checkpointing(model: nn.Module) -> int:
    """Recompute every block in backward; returns how many blocks were switched on."""
    count = 0
    for module in model.modules():
        if hasattr(type(module), "checkpoint") and hasattr(module, "_inner"):
            module.checkpoint = True
            count += 1
    if count == 0:
        raise ConfigError(
            f"checkpointing=True found no checkpointable block in {type(model).__name__}; "
            "use workbench.parallel.models.MLP or GPT"
        )
    return count


def compute_dtype(precision: str) -> torch.dtype:
    if precision not in PRECISIONS:
        raise choices_error("precision", precision, PRECISIONS)
    return torch.bfloat16 if precision == "bf16" else torch.float32


def check_precision(precision: str, device: torch.device) -> None:
    """Raise ConfigError if ``precision`` cannot run on ``device``.

    CPUs run bf16 autocast (natively or emulated) and gloo reduces bfloat16, so the case
    that fails is a GPU without bf16 (before Ampere): fail here, not inside a kernel.
    """
    compute_dtype(precision)
    if precision != "bf16":
        return
    if device.type == "cuda" and not torch.cuda.is_bf16_supported():
        raise ConfigError(
            f"precision='bf16' is not supported on {torch.cuda.get_device_name(device)}; "
            "choose precision='fp32' (valid choices: 'fp32', 'bf16' on bf16-capable GPUs/CPUs)"
        )


@contextlib.contextmanager
def autocast(precision: str, device: torch.device) -> Iterator[None]:
    """bf16 autocast for the forward, or nothing for fp32."""
    if precision == "bf16":
        with torch.autocast(device_type=device.type, dtype=torch.bfloat16):
            yield
    else:
        yield
