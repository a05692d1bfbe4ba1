"""MemoryTracer: exact bytes by category, activations layer by layer, peaks, hooks removed."""

from __future__ import annotations

import itertools

import pytest
import torch
from torch import nn
from torch.nn.attention import SDPBackend, sdpa_kernel

from tests.trace.models import TiedLM, make_mlp, saved_ground_truth
from workbench.trace import (
    MemorySample,
    MemoryTracer,
    Recorder,
    gradient_bytes,
    optimizer_bytes,
    parameter_bytes,
    process_rss,
)

F32 = 4


def _mlp_numel(d_in: int, hidden: int, d_out: int, layers: int) -> int:
    dims = [d_in] + [hidden] * (layers - 1) + [d_out]
    return sum(a * b + b for a, b in itertools.pairwise(dims))


def test_params_grads_optimizer_exact_on_mlp() -> None:
    torch.manual_seed(0)
    model = make_mlp(16, 32, 8, layers=3)
    numel = _mlp_numel(16, 32, 8, 3)
    n_tensors = 6  # 3 weights + 3 biases
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    rec = Recorder(rank=3)
    tracer = MemoryTracer(model, opt, rec)
    before = tracer.sample("init")
    assert (before.params, before.grads, before.optimizer) == (numel * F32, 0, 0)

    model(torch.randn(4, 16)).sum().backward()
    opt.step()
    after = tracer.sample("after step")
    assert after.params == numel * F32
    assert after.grads == numel * F32
    # AdamW: exp_avg + exp_avg_sq per parameter; the 0-dim fp32 step counter of each
    # parameter tensor is bookkeeping, recorded as "other".
    assert after.optimizer == 2 * numel * F32
    assert after.other == n_tensors * F32
    assert after.rank == 3 and after.label == "after step"
    assert optimizer_bytes(opt) == after.optimizer

    sgd = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    sgd.step()
    assert optimizer_bytes(sgd) == numel * F32  # one momentum buffer per parameter
    tracer.set_optimizer(sgd)
    assert tracer.sample().optimizer == numel * F32


def test_shared_storages_count_once() -> None:
    vocab, dim = 50, 12
    model = TiedLM(vocab, dim)
    expected = (vocab * dim + dim * dim + dim) * F32  # head.weight is embed.weight
    assert parameter_bytes(model) == expected

    # Two distinct Parameter objects on one storage, and a view of a storage.
    base = torch.zeros(10, 10)
    holder = nn.Module()
    holder.a = nn.Parameter(base)
    holder.b = nn.Parameter(base.view(100))
    holder.c = nn.Parameter(torch.zeros(7))
    assert parameter_bytes(holder) == (100 + 7) * F32

    tokens = torch.randint(0, vocab, (3, 5))
    model(tokens).sum().backward()
    assert gradient_bytes(model) == expected


def _activations_after_forward(model: nn.Module, run) -> tuple[int, int]:  # type: ignore[no-untyped-def]
    rec = Recorder()
    with MemoryTracer(model, None, rec) as tracer:
        out = run()
        during = tracer.activation_bytes
        out.float().sum().backward()
        after = tracer.activation_bytes
    return during, after


def test_activations_match_ground_truth_and_drop_after_backward() -> None:
    torch.manual_seed(0)
    batch = 5
    mlp = make_mlp(16, 32, 8, layers=3)
    x = torch.randn(batch, 16)
    during, after = _activations_after_forward(mlp, lambda: mlp(x))
    assert during == saved_ground_truth(mlp, lambda: mlp(x))
    # Analytic: input x, then per hidden layer the GELU input and the GELU output.
    assert during == batch * (16 + 2 * 32 + 2 * 32) * F32
    assert after == 0

    layer = nn.TransformerEncoderLayer(32, 4, 128, dropout=0.1, batch_first=True).eval()
    xs = torch.randn(2, 16, 32)
    during, after = _activations_after_forward(layer, lambda: layer(xs))
    assert during == saved_ground_truth(layer, lambda: layer(xs))
    assert during > 0 and after == 0


@pytest.mark.parametrize(("s", "b", "h", "a"), [(16, 2, 32, 4), (12, 3, 24, 3)])
def test_transformer_layer_matches_korthikanti(s: int, b: int, h: int, a: int) -> None:
    """nn.TransformerEncoderLayer, eval (no dropout), GELU, math attention, fp32.

    Korthikanti et al. count 34sbh + 5as^2b bytes in fp16 with dropout. Without dropout
    the masks (2sbh + as^2b) and the dropout output (2as^2b) go: 32sbh + 2as^2b, doubled
    for fp32: 64sbh + 4as^2b. PyTorch's math attention also saves a scaled copy of Q and a
    contiguous copy of K^T besides the QKV projection output: + 2 * 4sbh. Each LayerNorm
    saves mean and rstd, s*b floats each: + 2 * 2 * 4sb.
    Expected = 2(32sbh + 2as^2b) + 8sbh + 16sb.
    """
    torch.manual_seed(0)
    layer = nn.TransformerEncoderLayer(
        h, a, 4 * h, dropout=0.1, activation="gelu", batch_first=True
    ).eval()
    x = torch.randn(b, s, h)
    with sdpa_kernel(SDPBackend.MATH):
        during, after = _activations_after_forward(layer, lambda: layer(x))
    sbh = s * b * h
    expected = 2 * (32 * sbh + 2 * a * s * s * b) + 8 * sbh + 16 * s * b
    assert during == expected
    assert after == 0


def test_per_module_curve_peak_and_phases() -> None:
    torch.manual_seed(0)
    model = make_mlp(16, 32, 8, layers=4)
    opt = torch.optim.AdamW(model.parameters())
    rec = Recorder()
    tracer = MemoryTracer(model, opt, rec, per_module=True).start()
    x = torch.randn(6, 16)
    with rec.phase_span("forward", step=1):
        loss = model(x).sum()
    forward_peak = tracer.activation_bytes
    with rec.phase_span("backward"):
        tracer.sample("before backward")
        loss.backward()
        tracer.sample("after backward")
    tracer.stop()

    samples = [e for e in rec.events if type(e).__name__ == "MemorySample"]
    per_module = [s for s in samples if s.phase == "forward"]
    names = [name for name, _ in model.named_modules() if name]
    assert [s.label for s in per_module] == [*names, "Sequential"]
    curve = [s.activations for s in per_module]
    # Layer by layer: Linear 0 saves the batch (16 wide); every GELU then saves its input
    # (the Linear output) and every following Linear its input (the GELU output), 32 wide.
    batch = x.shape[0]
    widths = [16] + [32] * (len(names) - 1)
    expected = [batch * F32 * sum(widths[: i + 1]) for i in range(len(names))]
    assert curve == [*expected, expected[-1]]
    assert curve[-1] == forward_peak
    assert all(s.step == 1 and s.rank == 0 for s in samples)
    assert samples[-1].activations == 0 and samples[-1].grads == samples[-1].params

    peak = tracer.peak()
    assert peak is not None and peak.step == 1
    assert peak.activations == forward_peak
    assert peak.grads == parameter_bytes(model)
    assert tracer.peak(step=99) is None

    # stop() removed every hook: a new forward is neither sampled nor counted.
    n_events = len(rec)
    model(x).sum().backward()
    assert len(rec) == n_events and tracer.activation_bytes == 0
    assert not any(m._forward_hooks or m._forward_pre_hooks for m in model.modules())


def test_peak_catches_activations_between_samples() -> None:
    model = make_mlp(8, 16, 4, layers=3)
    rec = Recorder()
    with MemoryTracer(model, None, rec) as tracer:
        rec.step = 2
        tracer.sample("start")
        loss = model(torch.randn(3, 8)).sum()
        high = tracer.activation_bytes
        loss.backward()
        tracer.sample("end")  # neither sample saw the forward's activations
        assert tracer.peak().activations == high > 0


def test_start_is_idempotent_and_spans_separate_calls() -> None:
    model = make_mlp(8, 16, 4, layers=3)
    tracer = MemoryTracer(model, None, Recorder())
    assert tracer.start() is tracer.start()

    def forward() -> torch.Tensor:  # phases run in separate calls, as on engines
        return model(torch.randn(2, 8)).sum()

    loss = forward()
    assert tracer.activation_bytes > 0
    loss.backward()
    tracer.stop()
    tracer.stop()
    assert not tracer.active
    loss = forward()
    assert tracer.activation_bytes == 0


def test_allocator_is_process_rss_on_cpu() -> None:
    model = make_mlp(8, 16, 4, layers=3)
    sample = MemoryTracer(model, None, Recorder()).sample()
    rss = process_rss()
    assert sample.allocator > 0
    assert abs(sample.allocator - rss) < 64 * 2**20  # same measure, moments apart


def test_an_activation_peak_inside_a_phase_becomes_its_own_sample() -> None:
    torch.manual_seed(0)
    model = make_mlp(16, 32, 8, layers=3)
    rec = Recorder()
    tracer = MemoryTracer(model, None, rec).start()
    try:
        with rec.phase_span("forward"):
            loss = model(torch.randn(4, 16)).sum()
            peak_live = tracer.activation_bytes
            loss.backward()  # frees everything saved before the phase ends
        end = tracer.sample("end")
    finally:
        tracer.stop()
    samples = [e for e in rec.events if isinstance(e, MemorySample)]
    assert [s.label for s in samples] == ["peak", "end"]
    assert samples[0].activations == peak_live > 0 == end.activations
    assert samples[0].t <= end.t


def test_gradient_bytes_of_counts_each_gradient_storage_once() -> None:
    from workbench.trace.memory_cache import parameters_of
    from workbench.trace.storage import gradient_bytes_of, storage_bytes

    model = make_mlp(8, 16, 4, layers=3)
    params = parameters_of(model)
    assert gradient_bytes_of(params) == 0  # no gradients yet
    model(torch.randn(3, 8)).sum().backward()
    assert gradient_bytes_of(params) == gradient_bytes(model) == parameter_bytes(model)
    # Gradients as views of one flat buffer (DDP's gradient_as_bucket_view): the buffer
    # is counted once, whole, including bytes no gradient covers.
    flat = torch.zeros(sum(p.numel() for p in params) + 5)
    offset = 0
    for p in params:
        p.grad = flat[offset : offset + p.numel()].view_as(p)
        offset += p.numel()
    params[0].grad = None
    assert gradient_bytes_of(params) == flat.untyped_storage().nbytes()
    assert gradient_bytes_of(params) == storage_bytes(p.grad for p in params if p.grad is not None)


def test_peak_is_the_per_category_maximum_of_the_samples() -> None:
    model = make_mlp(8, 16, 4, layers=3)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    rec = Recorder(rank=3)
    with MemoryTracer(model, opt, rec) as tracer:
        rec.step = 5
        samples = [tracer.sample("start")]
        loss = model(torch.randn(3, 8)).sum()
        samples.append(tracer.sample("forward"))
        loss.backward()
        samples.append(tracer.sample("backward"))
        opt.step()
        opt.zero_grad()
        samples.append(tracer.sample("optimizer"))
    peak = tracer.peak()
    assert peak is not None
    assert (peak.rank, peak.step, peak.phase, peak.label) == (3, 5, "", "peak")
    assert peak.t == samples[-1].t
    for category in ("params", "grads", "optimizer", "activations", "other", "allocator"):
        assert getattr(peak, category) == max(getattr(s, category) for s in samples)
    # Each category peaks at a different sample: the peak is not any one sample.
    assert peak.activations == samples[1].activations > samples[-1].activations
    assert peak.optimizer == samples[-1].optimizer > samples[1].optimizer


def test_a_view_of_another_models_parameter_is_not_an_activation() -> None:
    """A frozen model the tracer was not given (a teacher): autograd saves views of its
    parameters, which are parameters, not activations, though their storages are not
    among the traced model's."""
    teacher = nn.Linear(8, 8).requires_grad_(False)
    student = make_mlp(8, 16, 8, layers=2)
    x = torch.randn(4, 8, requires_grad=True)
    with MemoryTracer(student, None, Recorder()) as tracer:
        y = x @ teacher.weight.t()  # saves the transposed view of teacher.weight for x's grad
        assert tracer.activation_bytes == 0
        z = x @ teacher.weight.t().detach()  # a plain alias of its storage, not a view
        assert tracer.activation_bytes == teacher.weight.untyped_storage().nbytes()
        del z
        assert tracer.activation_bytes == 0
        y.sum().backward()
    assert tracer.activation_bytes == 0


def test_a_freed_handle_is_uncounted_before_its_address_is_counted_again() -> None:
    """Freed handles are uncounted lazily (``_Live.drain``); a storage at the address of one
    freed but not yet drained must be counted as the new storage it is, with its own size."""
    import numpy as np

    tracer = MemoryTracer(make_mlp(4, 8, 2), None, Recorder())
    pack = tracer._make_pack()
    buffer = np.zeros(64, dtype=np.float32)
    whole = torch.from_numpy(buffer)  # a storage of 256 bytes at the buffer's address
    half = torch.from_numpy(buffer[:32])  # another storage, 128 bytes, at the same address
    assert whole.untyped_storage().data_ptr() == half.untyped_storage().data_ptr()

    handle = pack(whole)
    assert tracer.activation_bytes == 256
    del handle  # autograd freed it: uncounting is queued
    kept = pack(half)
    assert tracer.activation_bytes == 128
    again = pack(half)  # the same storage again: counted once
    assert tracer.activation_bytes == 128
    del kept, again
    assert tracer.activation_bytes == 0
    assert tracer._live.storages == {} and tracer._live.released == []
