"""FLOPs of a training step: what papers count (the MFU numerator) and what is executed.

FLOPs per token (Narayanan et al. 2021, eq. 3; PaLM appendix B): a training step runs
6·N matmul FLOPs per token (N: the matmul parameters, head included, embedding lookup
not) plus 12·L·s·h for attention (QKᵀ and AV; forward 4·L·s·h). That is the MFU numerator
papers use. HFU counts what is executed: a second forward under full recompute, the
attention core again under selective recompute.

Counting only: the time these FLOPs take is ``compute_time``'s, the step's sum
``timing``'s.
"""

from __future__ import annotations

from workbench.planner.params import count_params, matmul_params
from workbench.planner.specs import ModelSpec, TrainingSpec

__all__ = [
    "attention_fwd_flops",
    "executed_flops_per_token",
    "layer_head_flops",
    "model_flops_per_token",
    "passes",
    "training_flops",
]


def training_flops(n_params: int, tokens: int, training: TrainingSpec) -> float:
    """Executed matmul FLOPs of one step counted as 2·N per token per pass, attention left
    out: forward 2N, backward 2N (inputs) + 2N·trainable (weights), and a second forward
    under full recompute. (A parameter-count rule of thumb; ``step_time`` uses the
    per-layer count with attention, ``executed_flops_per_token``.)"""
    per_token = (4 + 2 * training.trainable) * n_params
    if training.recompute == "full":
        per_token += 2 * n_params
    return per_token * tokens


def attention_fwd_flops(model: ModelSpec, seq: int) -> float:
    """Forward attention-core FLOPs per token per layer (QKᵀ and AV: 2·s·h each)."""
    return 4.0 * seq * model.hidden


def model_flops_per_token(model: ModelSpec, seq: int) -> float:
    """The papers' MFU numerator per token: 6·N_matmul + 12·L·s·h."""
    return 6.0 * matmul_params(model) + 3.0 * model.layers * attention_fwd_flops(model, seq)


def passes(training: TrainingSpec) -> tuple[float, float]:
    """(matmul passes, attention-core passes) per token in units of one forward:
    forward 1, backward 1 + trainable (inputs and weights) for matmuls, 2 for attention;
    +1 forward of everything under full recompute, of the attention core under selective
    recompute without FlashAttention."""
    matmul = 2.0 + training.trainable
    attention = 3.0
    if training.recompute == "full":
        matmul += 1.0
        attention += 1.0
    elif training.recompute == "selective" and not training.flash_attention:
        attention += 1.0
    return matmul, attention


def executed_flops_per_token(model: ModelSpec, training: TrainingSpec, seq: int) -> float:
    """Executed FLOPs per token of the whole model (the HFU numerator per token)."""
    matmul, attention = passes(training)
    return 2.0 * matmul_params(model) * matmul + (
        model.layers * attention_fwd_flops(model, seq) * attention
    )


def layer_head_flops(model: ModelSpec, training: TrainingSpec, seq: int) -> tuple[float, float]:
    """Executed FLOPs per token of one transformer layer, and of the output head."""
    c = count_params(model)
    total_mm = matmul_params(model)
    head_mm = c.embedding if c.head == 0 else c.head
    layer_mm = (total_mm - head_mm) / model.layers
    matmul, attention = passes(training)
    layer = 2.0 * layer_mm * matmul + attention_fwd_flops(model, seq) * attention
    return layer, 2.0 * head_mm * matmul
