"""A notebook's runs on the shared 2-rank cluster, as a user writes them: a Hugging Face
GPT-2 built from a config (dropout 0.1 by default) under ``wb.Stepper`` gives the same
losses on every run, whatever the cells drew in between; ``strategy='single'`` runs on
one rank of a 2-engine cluster (built-in and own model) and is the reference bit for bit."""

from __future__ import annotations

from typing import Any

import cloudpickle
import pytest
import torch

from tests.parallel import _user_models as um
from workbench.cluster import Cluster
from workbench.ui.stepper import Stepper

cloudpickle.register_pickle_by_value(um)

STEPS = 3


def make_gpt2() -> torch.nn.Module:
    """What a user writes: a GPT-2 from a config, dropout left at its default (0.1)."""
    from transformers import GPT2Config, GPT2LMHeadModel

    config = GPT2Config(n_layer=2, n_embd=32, n_head=2, vocab_size=um.VOCAB, n_positions=um.SEQ)
    assert config.resid_pdrop == 0.1 and config.attn_pdrop == 0.1
    return GPT2LMHeadModel(config)


def gpt2_loss(output: Any, targets: torch.Tensor) -> torch.Tensor:
    return um.lm_loss(output.logits, targets)


def _draw(n: int) -> float:
    """A cell that draws random numbers on a rank (a different amount per rank)."""
    import torch.distributed as dist

    return float(torch.rand(n + 7 * dist.get_rank()).sum())


def _losses(cluster: Cluster, **kw: Any) -> tuple[list[float], list[float]]:
    """(losses per step, the single-device reference) of a fresh stepper's first steps."""
    stepper = Stepper(cluster=cluster, **kw)
    try:
        stepper.run(STEPS)
        losses = [e.value for e in stepper.events if getattr(e, "name", None) == "loss"]
        return losses, stepper.session.reference_losses(STEPS)
    finally:
        stepper.close()


@pytest.mark.parametrize("strategy", ["dp", "fsdp"])
def test_a_seeded_hf_gpt2_with_dropout_gives_the_same_losses_on_every_run(
    cluster: Cluster, strategy: str
) -> None:
    pytest.importorskip("transformers")
    user = {"model": make_gpt2, "data": um.make_data, "loss": gpt2_loss, "optimizer": um.adamw}
    cluster.run(_draw, 3)
    first, _ = _losses(cluster, strategy=strategy, **user)
    cluster.run(_draw, 11)
    again, _ = _losses(cluster, strategy=strategy, **user)
    other, _ = _losses(cluster, strategy=strategy, seed=5, **user)
    print(strategy, first, again, other)
    assert len(first) == 2 * STEPS  # each rank reports the global batch's loss
    assert again == first
    assert other != first


def test_single_runs_on_one_rank_of_a_two_engine_cluster(cluster: Cluster) -> None:
    assert cluster.world_size == 2
    builtin, builtin_ref = _losses(cluster, model="mlp-tiny", strategy="single")
    own, own_ref = _losses(
        cluster, model=um.make_dropout_model, data=um.make_data, loss=um.lm_loss,
        strategy="single",
    )  # fmt: skip
    assert len(builtin) == len(own) == STEPS  # one rank's losses, not two
    assert builtin == builtin_ref and own == own_ref  # the reference, bit for bit
