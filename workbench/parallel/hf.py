"""Hugging Face ``transformers`` models under the workbench (optional: ``pip install
distributed-workbench[hf]``).

A causal LM built from a config has random weights and needs no download; its forward
returns a ``ModelOutput``, so ``causal_lm_loss`` reads ``.logits``. Its TP plan comes from
its own ``config.base_model_tp_plan`` (``tp_plan.hf_tp_plan``), and FSDP wraps its decoder
layers (the largest ``ModuleList``), so ``Layout`` applies to it like to any model.

``tiny_llama_lora`` is that model under ``peft``'s LoRA (``get_peft_model``): the base
weights frozen, the adapters trainable, both in each decoder layer's FSDP unit (FSDP2
shards every parameter on its own and reduce-scatters only the gradients that exist).
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from workbench.errors import ConfigError

__all__ = ["causal_lm_loss", "tiny_llama", "tiny_llama_lora"]


def causal_lm_loss(output: Any, targets: torch.Tensor) -> torch.Tensor:
    """Mean cross-entropy of ``output.logits`` (or ``output`` itself) against ``targets``."""
    logits = getattr(output, "logits", output)
    return F.cross_entropy(logits.reshape(-1, logits.shape[-1]).float(), targets.reshape(-1))


def tiny_llama(**config: Any) -> nn.Module:
    """A small ``LlamaForCausalLM`` with random weights (defaults: vocab 32, hidden 32,
    2 layers, 4 heads / 2 key-value heads); keyword arguments override the config."""
    try:
        from transformers import LlamaConfig, LlamaForCausalLM
    except ImportError as exc:
        raise ConfigError(
            f"tiny_llama needs Hugging Face transformers ({exc}); install it with "
            "`pip install distributed-workbench[hf]`"
        ) from None
    settings: dict[str, Any] = {
        "vocab_size": 32,
        "hidden_size": 32,
        "intermediate_size": 64,
        "num_hidden_layers": 2,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "max_position_embeddings": 64,
        "tie_word_embeddings": False,
        "use_cache": False,
        **config,
    }
    return LlamaForCausalLM(LlamaConfig(**settings))


def tiny_llama_lora(
    r: int = 4, target_modules: tuple[str, ...] = ("q_proj", "v_proj"), **config: Any
) -> nn.Module:
    """``tiny_llama(**config)`` with LoRA adapters of rank ``r`` on ``target_modules``
    (``peft.get_peft_model``; no dropout, so every layout computes the same numbers)."""
    try:
        from peft import LoraConfig, get_peft_model
    except ImportError as exc:
        raise ConfigError(
            f"tiny_llama_lora needs peft ({exc}); install it with "
            "`pip install distributed-workbench[hf]`"
        ) from None
    lora = LoraConfig(r=r, lora_alpha=2 * r, lora_dropout=0.0, target_modules=list(target_modules))
    return get_peft_model(tiny_llama(**config), lora)  # type: ignore[no-any-return]
