"""The notebook side of "a host goes down whole mid-run" (driver.py scenario ``host_loss``).

4 ranks on wbmn1 + wbmn2 (2 each), data parallel. First the uninterrupted 9-step run on
those ranks (its losses and each step's sample ids). Then an elastic run: 3 steps with a
checkpoint, a step during which the test (root, outside) takes the last rank's host down
whole, the ``HostLost`` that step raises (when, naming what), the shrink to 2 ranks and 3
more steps, then, once the test brought the host back, ``grow(2, hosts=[it])`` and the
last 3 steps.

The pytest side and this process meet through files in the bed user's home: this side
writes ``<name>.ready`` and waits for the test's ``<name>.done``.
"""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any

SPEC = {"model": "mlp-tiny", "strategy": "dp", "batch_size": 8}
STEPS = 9
SLOW_FORWARD_S = 4.0  # the step is still in its forward phase when the host goes down


def _slow_forward(seconds: float) -> None:
    """Make the next forward phase wait ``seconds`` first (its result is unchanged)."""
    import time

    from workbench.engine.state import engine_state

    run = engine_state().run
    original = run._forward

    def forward(index: int) -> None:
        time.sleep(seconds)
        original(index)

    run._forward = forward


def _losses(session: Any) -> list[float]:
    from workbench.trace import Metric

    return [
        e.value
        for e in session.events
        if isinstance(e, Metric) and e.rank == 0 and e.name == "loss"
    ]


def _samples(cluster: Any, steps: range) -> dict[int, list[int]]:
    """Step -> every rank's dataset indices of that step, sorted (the global batch)."""
    from workbench.engine import train_run

    out: dict[int, list[int]] = {s: [] for s in steps}
    for per_rank in cluster.run(train_run.sample_ids):
        for step, ids in per_rank.items():
            if int(step) in out:
                out[int(step)].extend(ids)
    return {s: sorted(ids) for s, ids in out.items()}


def _meet(home: Path, name: str, timeout: float = 300, say: str = "") -> str:
    """Tell the test we reached ``name`` (with ``say``); wait for its answer (what it wrote)."""
    (home / f"{name}.ready").write_text(say)
    done = home / f"{name}.done"
    deadline = time.monotonic() + timeout
    while not done.exists():
        if time.monotonic() > deadline:
            raise TimeoutError(f"the test did not answer {name} within {timeout}s")
        time.sleep(0.05)
    return done.read_text()


def _hosts(cluster: Any) -> list[str]:
    return [r.host for r in cluster.ranks]


def _uninterrupted(cluster: Any, spec: Any, out: dict[str, Any]) -> None:
    """The reference: ``STEPS`` steps on every rank with no fault, losses and sample ids."""
    from workbench.session.training import TrainingSession

    plain = TrainingSession(cluster, spec, timeout=120)
    plain.run(STEPS)
    out["expected"], out["expected_ids"] = _losses(plain), _samples(cluster, range(STEPS))
    plain.close()


def lose_host_and_shrink(
    cluster: Any, out: dict[str, Any], home: Path
) -> tuple[Any, dict[int, list[int]]]:
    """The reference run, then the elastic run up to the loss, the shrink and steps 3..5:
    the session and the samples of steps 0..5."""
    from workbench.errors import HostLost
    from workbench.parallel import RunSpec
    from workbench.session.training import TrainingSession

    spec = RunSpec(**SPEC)
    _uninterrupted(cluster, spec, out)

    session = TrainingSession(
        cluster,
        spec,
        timeout=120,
        checkpoint_dir=home / f"ckpt-{os.getpid()}",
        checkpoint_every=3,
        elastic=True,
    )
    session.run(3)
    ids = _samples(cluster, range(3))
    out["hosts_before"] = _hosts(cluster)
    # ranks go to hosts in the order their engines registered: the last rank's host is the
    # one that does not hold rank 0 (the spare scenario loses rank 0's)
    out["victim"] = victim = cluster.ranks[-1].host
    cluster.run(_slow_forward, SLOW_FORWARD_S)
    _meet(home, "take_down", timeout=30, say=victim)  # the test cuts it a moment after this
    lost: dict[str, Any] = {"error": None}
    try:
        session.step()
    except HostLost as exc:
        lost.update(host=exc.host, ranks=exc.ranks, error=str(exc))
    except Exception as exc:  # the wrong error: the test shows it
        lost["error"] = f"{type(exc).__name__}: {exc}"
    lost["raised_at"] = time.monotonic()
    out["lost"] = lost

    started = time.perf_counter()
    out["shrink_report"] = session.recover()  # elastic=True: a shrink
    out["shrink_s"] = time.perf_counter() - started
    out["hosts_shrunk"] = _hosts(cluster)
    out["spec_shrunk"] = [session.spec.batch_size, session.spec.grad_accum]
    session.run(3)  # steps 3..5 on wbmn1 alone, checkpointed at 6
    ids.update(_samples(cluster, range(3, 6)))
    return session, ids


def lose_host_and_go_on(cluster: Any, out: dict[str, Any], home: Path) -> None:
    session, ids = lose_host_and_shrink(cluster, out, home)
    victim = out["victim"]
    _meet(home, "bring_up")
    out["grow_report"] = session.grow(2, hosts=[victim])
    out["hosts_grown"] = _hosts(cluster)
    out["spec_grown"] = [session.spec.batch_size, session.spec.grad_accum]
    session.run(3)
    ids.update(_samples(cluster, range(6, STEPS)))
    out["losses"], out["ids"] = _losses(session), ids
    session.close()


def _env() -> dict[str, str]:
    import os
    import socket

    keys = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "GROUP_RANK", "MASTER_ADDR")
    return {"hostname": socket.gethostname(), **{k: os.environ.get(k, "") for k in keys}}


def lose_host_onto_spare(cluster: Any, out: dict[str, Any], home: Path) -> None:
    """Scenario ``spare``: rank 0's host (wbmn1) goes down mid-step; recovery starts its
    ranks on the spare (wbmn3) and the run rolls back to its last checkpoint."""
    from workbench.errors import HostLost
    from workbench.parallel import RunSpec
    from workbench.session.training import TrainingSession

    spec = RunSpec(**SPEC)
    _uninterrupted(cluster, spec, out)

    session = TrainingSession(
        cluster, spec, timeout=120, checkpoint_dir=home / f"ckpt-{os.getpid()}", checkpoint_every=3
    )
    session.run(3)
    ids = _samples(cluster, range(3))
    out["hosts_before"] = _hosts(cluster)
    out["victim"] = victim = cluster.ranks[0].host  # the rendezvous host
    cluster.run(_slow_forward, SLOW_FORWARD_S)
    _meet(home, "take_down", timeout=30, say=victim)
    lost: dict[str, Any] = {"error": None}
    try:
        session.step()
    except HostLost as exc:
        lost.update(host=exc.host, ranks=exc.ranks, error=str(exc))
    except Exception as exc:
        lost["error"] = f"{type(exc).__name__}: {exc}"
    lost["raised_at"] = time.monotonic()
    out["lost"] = lost
    started = time.perf_counter()
    out["recover_report"] = session.recover()
    out["recover_s"] = time.perf_counter() - started
    out["hosts_after"] = _hosts(cluster)
    out["env_after"] = cluster.run(_env)
    session.run(STEPS - 3)
    ids.update(_samples(cluster, range(3, STEPS)))
    out["losses"], out["ids"] = _losses(session), ids
    session.close()


# Run on the engines, which cannot import this module (it is not installed there): shipped
# by value, as ipyparallel ships functions of ``__main__`` (each imports what it uses).
for _shipped in (_slow_forward, _env):
    _shipped.__module__ = "__main__"
