from __future__ import annotations

from workbench.plots import engine_memory_figure

MIB = 1 << 20


def test_rss_per_rank_in_mib_and_no_cuda_series_on_cpu() -> None:
    fig = engine_memory_figure({1: {"rss": 30 * MIB, "cuda_allocated": 0}, 0: {"rss": 20 * MIB}})
    assert [t.name for t in fig.data] == ["process RSS"]
    assert list(fig.data[0].x) == [0, 1] and list(fig.data[0].y) == [20.0, 30.0]


def test_cuda_series_when_any_rank_holds_device_memory() -> None:
    fig = engine_memory_figure(
        {0: {"rss": MIB, "cuda_allocated": 0}, 1: {"rss": MIB, "cuda_allocated": 512 * MIB}}
    )
    assert [t.name for t in fig.data] == ["process RSS", "CUDA allocated"]
    assert list(fig.data[1].y) == [0.0, 512.0]


def test_no_engines_is_an_empty_figure() -> None:
    assert [t.name for t in engine_memory_figure({}).data] == ["process RSS"]
    assert list(engine_memory_figure({}).data[0].x) == []
