"""A call whose ranks wait on a host that went silent returns as soon as the controller
drops the host's engines (``fail_wait.wait_for_a_failure``, run by
``RankDispatch.wait_unless_a_rank_failed``), with no engines: the survivors' requests never
finish by themselves (no reset reaches them), so waiting for them to fail first meant
waiting for the process group's timeout."""

from __future__ import annotations

import threading

from workbench.cluster.dispatch.fail_wait import wait_for_a_failure


class _Pending:
    """A request that never gets its reply (a rank blocked in a collective)."""

    def ready(self) -> bool:
        return False

    def wait(self, timeout: float) -> None:
        threading.Event().wait(timeout)


def test_the_wait_ends_once_an_engine_is_gone_though_no_rank_failed() -> None:
    futures = [_Pending() for _ in range(4)]
    dead: set[int] = set()
    returned: list[bool] = []
    waiter = threading.Thread(
        target=lambda: returned.append(wait_for_a_failure(futures, None, lambda: bool(dead))),
        daemon=True,
    )
    waiter.start()
    waiter.join(1.0)
    assert waiter.is_alive()  # nothing has happened yet: it waits
    dead.update({12, 13})  # the controller dropped the silent host's engines
    waiter.join(60)  # a bound on a hang, generous for a busy machine
    assert not waiter.is_alive(), "the wait went on after the engines were gone"
    assert returned == [False]  # collect() takes over and reports the dead engines
