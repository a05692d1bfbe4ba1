"""Scaling: steps/s on 1 vs 2 engines (DP, fixed global batch) against the planner.

Both runs go through the workbench on the same 2-engine cluster: 1 engine runs
``strategy='single'`` alone (rank 0; rank 1 idles), 2 engines run DDP (``strategy='dp'``,
overlapped buckets), interleaved. The planner then predicts the 2-engine step from a
hardware profile calibrated on this machine: the link from an all-reduce sweep on the same
engines (``fit_alpha_beta``), the compute rate from the measured 1-engine step.

    .venv/bin/python -m benchmarks.scaling_bench [--quick]
"""

from __future__ import annotations

import time
from dataclasses import asdict

from benchmarks.common import BenchResult, Row, Target, interleaved, median, run_main

__all__ = ["NAME", "TITLE", "predict_speedup", "run"]

NAME = "scaling"
TITLE = "Scaling: steps/s on 1 vs 2 engines (DP, fixed global batch) vs the planner"
SPEEDUP = Target(">=", 1.7)
PREDICTION = Target("<=", 0.15, "<= 0.15 (|predicted/measured - 1|)")
MODEL = "gpt-small"
BATCH = 16


def predict_speedup(batch: int, seq: int, t1: float, fit: object) -> tuple[float, dict[str, float]]:
    """The planner's 2-rank DP speedup for ``MODEL``, with compute calibrated so that its
    1-rank step takes the measured ``t1`` seconds and links from the all-reduce ``fit``."""
    from workbench.parallel.models import planner_model
    from workbench.planner import (
        ParallelSpec,
        TrainingSpec,
        hardware_from_fit,
        step_time,
        training_flops,
    )

    model = planner_model(MODEL)
    one = TrainingSpec(
        micro_batch=batch, seq=seq, precision="fp32", optimizer="adamw", mfu=1.0, dropout=False
    )
    # Effective FLOP/s of one engine on this model: the planner's executed FLOPs / t1.
    peak = training_flops(model.n_params, batch * seq, one) / t1
    hw = hardware_from_fit(fit, peak_flops=peak, processes_per_node=2)  # type: ignore[arg-type]
    t_one = step_time(model, one, ParallelSpec(dp=1), hw, seq=seq, micro_batches=1)
    two = one.with_(micro_batch=batch // 2)
    t_two = step_time(model, two, ParallelSpec(dp=2), hw, seq=seq, micro_batches=1)
    detail = {
        "effective_flops": peak,
        "t1_planner_s": t_one.total,
        "t2_planner_s": t_two.total,
        "t2_compute_s": t_two.compute,
        "t2_dp_comm_s": t_two.dp_comm,
        "t2_dp_exposed_s": t_two.dp_exposed,
    }
    return t_one.total / t_two.total, detail


def run(quick: bool = False) -> BenchResult:
    import psutil

    from workbench.cluster import Cluster, remote_run
    from workbench.cluster.session import TrainingSession
    from workbench.parallel import RunSpec, build_model, get_config
    from workbench.parallel.commbench import allreduce_sweep
    from workbench.planner import fit_alpha_beta

    batch = BATCH
    steps, repeats = (2, 1) if quick else (8, 3)
    single = RunSpec(model=MODEL, strategy="single", batch_size=batch, trace=False)
    dp = RunSpec(model=MODEL, strategy="dp", batch_size=batch, trace=False, overlap=True)
    seq = get_config(MODEL).seq_len
    n_params = sum(p.numel() for p in build_model(get_config(MODEL)).parameters())
    cluster = Cluster(n=2, backend="gloo")
    try:
        cluster.start_sync()
        sizes = [65536 * 4**k for k in range(5)]  # 64 KB .. 16 MB (gradients: ~3.3 MB)
        samples = cluster.run(allreduce_sweep, sizes, 5, 1, timeout=300)[0]
        fit = fit_alpha_beta(samples, n=2)

        engines = [psutil.Process(r.pid) for r in cluster.ranks]
        # CPU seconds each engine used per step, and the share of a core it got: on a busy
        # machine the second engine does not get a core of its own, and this shows it.
        cpu: dict[str, list[list[float]]] = {"1 engine": [], "2 engines": []}

        def cpu_now(procs: list[psutil.Process]) -> list[float]:
            return [sum(p.cpu_times()[:2]) for p in procs]

        def per_step(before: list[float], procs: list[psutil.Process]) -> list[float]:
            return [(b - a) / steps for a, b in zip(before, cpu_now(procs), strict=True)]

        def one_engine() -> float:
            built = cluster.run(remote_run.build_run, asdict(single), ranks=[0], timeout=300)
            cursor = built[0]["cursor"]
            cursor = cluster.run(remote_run.run_steps, 1, cursor, ranks=[0])[0]["cursor"]
            c0, start = cpu_now(engines[:1]), time.perf_counter()
            cluster.run(remote_run.run_steps, steps, cursor, ranks=[0], timeout=600)
            elapsed = time.perf_counter() - start
            cpu["1 engine"].append(per_step(c0, engines[:1]))
            return elapsed / steps

        def two_engines() -> float:
            session = TrainingSession(cluster, dp, timeout=600)
            session.build()
            session.step(1)
            c0, start = cpu_now(engines), time.perf_counter()
            session.step(steps)
            elapsed = time.perf_counter() - start
            cpu["2 engines"].append(per_step(c0, engines))
            session.close()
            return elapsed / steps

        times = interleaved({"1 engine": one_engine, "2 engines": two_engines}, repeats)
        cluster.run(remote_run.close_run)
    finally:
        cluster.stop_sync()

    t1, t2 = median(times["1 engine"]), median(times["2 engines"])
    measured = t1 / t2
    predicted, detail = predict_speedup(batch, seq, t1, fit)
    error = abs(predicted / measured - 1)
    result = BenchResult(
        NAME,
        TITLE,
        ran=f"{MODEL} ({n_params:,} parameters), AdamW, fp32, global batch {batch} x seq {seq}, "
        f"no tracing; 1 engine strategy='single' vs 2 engines DDP (overlap=True), "
        f"{steps} steps per timing through cluster.run / TrainingSession.step, {repeats} "
        f"interleaved timings each; planner link from an all-reduce sweep on the same engines "
        f"(alpha {fit.latency * 1e6:.0f} us, B {fit.bandwidth / 1e9:.2f} GB/s), compute "
        "calibrated to the 1-engine step",
        details={"step_s": times, "fit": fit.as_dict(), "planner": detail},
    )
    result.rows.append(
        Row.compare(
            "steps/s, 2 engines vs 1 engine",
            "steps/s",
            1 / t2,
            1 / t1,
            raw_label="1 engine",
            target=SPEEDUP,
            samples=repeats,
        )
    )
    cpu1 = median([c[0] for c in cpu["1 engine"]])
    cpu2 = [median([c[r] for c in cpu["2 engines"]]) for r in range(2)]
    result.rows.append(
        Row.compare(
            "CPU seconds per step: busiest of 2 engines vs 1 engine",
            "ms",
            max(cpu2) * 1e3,
            cpu1 * 1e3,
            raw_label="1 engine",
            target=None,
            samples=repeats,
            note=f"share of a core the engines got: 1 engine {cpu1 / t1:.0%}; 2 engines "
            + " / ".join(f"{c / t2:.0%}" for c in cpu2)
            + f"; CPU-time speedup {cpu1 / max(cpu2):.2f}x",
        )
    )
    result.details["cpu_s_per_step"] = cpu
    result.rows.append(
        Row(
            metric="speedup, measured vs planner prediction",
            unit="x",
            workbench=measured,
            raw=predicted,
            raw_label="planner",
            ratio=error,
            target=PREDICTION.describe(),
            met=PREDICTION.check(error),
            samples=repeats,
            note=f"planner: 2-engine step {detail['t2_planner_s'] * 1e3:.0f} ms = compute "
            f"{detail['t2_compute_s'] * 1e3:.0f} ms + exposed all-reduce "
            f"{detail['t2_dp_exposed_s'] * 1e3:.1f} ms (of {detail['t2_dp_comm_s'] * 1e3:.1f})",
        )
    )
    return result


if __name__ == "__main__":
    raise SystemExit(run_main(run))
