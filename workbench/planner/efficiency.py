"""Per-operation compute efficiency: matmuls at a share of peak, memory-bound ops at the
memory bandwidth.

One flat efficiency for every FLOP cannot follow the papers: Narayanan et al. 2021
(Table 1) reach 44% of peak at 1.7B parameters and 52% at 1T on the same A100s, and the
planner with one efficiency was 9% fast on the first and 27% slow on the last. What does
not grow with the matmuls is the work between them: layer norms, bias, GeLU, dropout,
residual adds and the softmax over the s x s scores read and write activations and run at
memory bandwidth, not at tensor-core peak. Per token and layer the matmuls grow as h²/t,
that traffic as h (unsplit by TP without sequence parallelism) plus a·s (the scores), so
its share falls with model width and the step-time efficiency rises, as published.

The model, per transformer layer and micro-batch on one rank:

    time = executed matmul + attention FLOPs / (GEMM_EFFICIENCY · peak)
         + TRAFFIC_FACTOR · activation bytes / memory bandwidth  (x2 under full recompute)

``activation bytes`` is the layer's stored activations without recompute (Korthikanti et
al. 2022's term-by-term count, ``layer_activation_bytes``), a proxy for the bytes the
memory-bound ops move; it already splits by TP and sequence parallelism and drops the
scores under FlashAttention. The two constants are fitted on two published rows only,
Narayanan et al. 2021 Table 1's 1.7B (32 GPUs, 137 TFLOP/s) and 1008B (3072 GPUs, 163
TFLOP/s) rows, the smallest and the largest (``fit_efficiency``; tests/planner re-derive
them). Every other published step-time row is held out and validates the model.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from workbench.errors import ConfigError

__all__ = [
    "CALIBRATION_ROWS",
    "GEMM_EFFICIENCY",
    "TRAFFIC_FACTOR",
    "fit_efficiency",
]

# Fitted by fit_efficiency on CALIBRATION_ROWS (tests/planner/test_efficiency.py re-runs it).
GEMM_EFFICIENCY = 0.765
TRAFFIC_FACTOR = 5.57
CALIBRATION_ROWS = ("narayanan-table1-1.7B", "narayanan-table1-1008B")


def fit_efficiency(
    rows: Sequence[tuple[Callable[..., float], float]],
    start: Sequence[float],
    *,
    iterations: int = 40,
) -> tuple[float, ...]:
    """The constants (as many as ``rows``, 1 or 2) that make each prediction hit its
    published value: ``rows`` is (predict(*constants) -> value, published) pairs.

    Newton's method with finite differences on the relative errors; the step-time model
    is smooth and monotonic in each constant, so it converges in a few steps.
    """
    n = len(start)
    if n not in (1, 2) or len(rows) != n:
        raise ConfigError(
            f"fit_efficiency fits 1 or 2 constants from as many rows; got {len(rows)} rows "
            f"for {n} constants"
        )
    x = [float(v) for v in start]

    def residual(v: Sequence[float]) -> list[float]:
        return [predict(*v) / published - 1.0 for predict, published in rows]

    for _ in range(iterations):
        r = residual(x)
        if max(abs(e) for e in r) < 1e-12:
            break
        cols = []  # cols[j][i] = d r_i / d x_j
        for j in range(n):
            step = 1e-7 * max(abs(x[j]), 1e-3)
            moved = list(x)
            moved[j] += step
            cols.append([(a - b) / step for a, b in zip(residual(moved), r, strict=True)])
        if n == 1:
            dx = [-r[0] / cols[0][0]]
        else:
            (a, c), (b, d) = cols  # J = [[a, b], [c, d]]
            det = a * d - b * c
            if det == 0:
                raise ConfigError("the calibration rows do not determine the constants")
            dx = [(-r[0] * d + r[1] * b) / det, (-r[1] * a + r[0] * c) / det]
        x = [max(1e-6, xi + di) for xi, di in zip(x, dx, strict=True)]
    return tuple(x)
