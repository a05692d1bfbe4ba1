"""The notebook side of "a host's link is cut while its processes keep running" (driver.py
scenario ``partition``).

As ``host_loss_scenario.lose_host_and_shrink``, up to the shrink: the uninterrupted 9-step run
on 4 ranks over wbmn1 + wbmn2, then an elastic run with a checkpoint every 3 steps, the link
of the last rank's host cut by the test during step 3 (its engines run on), ``HostLost``,
the shrink to 2 ranks and steps 3..5. Then the test, the link still cut, waits until that
host's engines ended themselves (``workbench.engine.fencing``) and plugs the link back in;
this side lets the engines' heartbeat run a few windows with the host back, notes which
engines the controller and the rank table count, and runs steps 6..8 on the 2 ranks: a
returning host must not rejoin the re-formed group.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

from host_loss_scenario import _hosts, _losses, _meet, _samples, lose_host_and_shrink

BACK_S = 5.0  # ten heartbeat periods with the host back before the rank table is read


def cut_off_and_go_on(cluster: Any, out: dict[str, Any], home: Path) -> None:
    session, ids = lose_host_and_shrink(cluster, out, home)  # "take_down": the link cut
    _meet(home, "plug_in", timeout=600)  # the test: the engines there fenced, link back
    time.sleep(BACK_S)
    out["engines_after"] = sorted(cluster.client.ids)
    out["rank_engines_after"] = [r.engine_id for r in cluster.ranks]
    out["hosts_after"] = _hosts(cluster)
    session.run(3)  # steps 6..8, the host back but not in the group
    ids.update(_samples(cluster, range(6, 9)))
    out["losses"], out["ids"] = _losses(session), ids
    session.close()
