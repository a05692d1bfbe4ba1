"""Expert parallel: the built-in ``moe-tiny`` with its experts spread over the ranks and
tokens carried by all-to-all equals one device, as does dp on the same model (the
baseline). Routing is deterministic and dropless. One forked gloo launch."""

from __future__ import annotations

from typing import Any

import pytest
import torch

from tests.harness import run_ranks
from tests.parallel._equivalence import assert_equivalent, compare_cases
from workbench.errors import ParallelError
from workbench.parallel.models import build_model, get_config
from workbench.parallel.run_spec import RunSpec

CASES = [
    {"model": "moe-tiny", "strategy": "ep", "optimizer": "sgd", "lr": 1e-2},
    {"model": "moe-tiny", "strategy": "ep", "optimizer": "adamw", "lr": 1e-3},
    {"model": "moe-tiny", "strategy": "dp", "optimizer": "sgd", "lr": 1e-2},
]


def _traced(rank: int) -> dict[str, Any]:
    from workbench.parallel import build_train_step

    step = build_train_step(RunSpec(model="moe-tiny", strategy="ep"))
    step.run_step()
    step.close()
    comm = [e for e in step.recorder.events if getattr(e, "kind", "") == "comm"]
    return {
        "a2a": [(e.source, e.phase, e.bytes) for e in comm if e.op == "all_to_all"],
        "expert_bytes": step.model.expert_bytes(),
        "experts": sorted(
            {
                n.split("experts.")[1].split(".")[0]
                for n, _ in step.model.named_parameters()
                if "experts." in n
            }
        ),
    }


def _all(rank: int, world: int) -> dict[str, Any]:
    out = compare_cases(rank, world, CASES)
    out["traced"] = _traced(rank)
    return out


@pytest.fixture(scope="module")
def results() -> list[dict[str, Any]]:
    return run_ranks(_all, timeout=400)


@pytest.mark.engines
def test_expert_parallel_and_dp_equal_one_device(results: list[dict[str, Any]]) -> None:
    assert_equivalent({k: v for k, v in results[0].items() if k != "traced"}, len(CASES))


@pytest.mark.engines
def test_all_to_alls_are_recorded_with_bytes_per_expert(results: list[dict[str, Any]]) -> None:
    for rank, r in enumerate(results):
        t = r["traced"]
        print(rank, t)
        assert t["experts"] == (["0", "1"] if rank == 0 else ["2", "3"])  # 2 of 4 each
        dispatch = [a for a in t["a2a"] if a[0].startswith("ep-dispatch")]
        combine = [a for a in t["a2a"] if a[0] == "ep-combine"]
        assert len(dispatch) == len(combine) == 2  # one each per MoE layer, in forward
        assert all(phase == "forward" for _, phase, _ in dispatch + combine)
        # every token goes to top_k=2 experts: 8/2 samples x 16 tokens x 2 x 32 floats
        assert sum(t["expert_bytes"]) == 2 * (4 * 16 * 2 * 32 * 4)
        assert "e0:" in dispatch[0][0] and "e3:" in dispatch[0][0]
        # gradients go back the same way in backward
        assert any(phase == "backward" for _, phase, _ in t["a2a"])


@pytest.mark.engines
@pytest.mark.slow
def test_dp_by_ep_on_four_ranks_equals_one_device() -> None:
    """ep=2 of dp=4: experts over pairs of ranks, replicated over the two pairs."""
    cases = [{"model": "moe-tiny", "strategy": "dp_ep", "optimizer": "sgd", "lr": 1e-2}]
    assert_equivalent(run_ranks(compare_cases, cases, world_size=4, timeout=300)[0], 1)


def test_routing_is_deterministic_dropless_top_k() -> None:
    model = build_model(get_config("moe-tiny"))
    moe = model.layers["0"].mlp
    x = torch.randn(3, 5, 32, generator=torch.Generator().manual_seed(1))
    weights, chosen = moe.route(x.reshape(-1, 32))
    assert torch.equal(chosen, moe.route(x.reshape(-1, 32))[1])
    assert torch.allclose(weights.sum(-1), torch.ones(15))
    # dropless: each token's output is exactly its k experts' weighted sum
    tokens = x.reshape(-1, 32)
    expected = torch.stack(
        [
            sum(w * moe.experts[str(int(e))](t) for w, e in zip(ws, es, strict=True))
            for t, ws, es in zip(tokens, weights, chosen, strict=True)
        ]
    )
    assert torch.allclose(moe(x).reshape(-1, 32), expected, atol=1e-6)


def test_ep_on_a_dense_model_fails_before_any_rank() -> None:
    with pytest.raises(ParallelError, match="the gpt model is dense"):
        RunSpec(model="gpt-tiny", strategy="ep").dims(2).validate_for(get_config("gpt-tiny"))
    with pytest.raises(ParallelError, match="ep=3 does not divide the model's n_experts=4"):
        RunSpec(model="moe-tiny", strategy="ep").dims(3).validate_for(get_config("moe-tiny"))
