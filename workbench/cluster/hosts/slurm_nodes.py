"""What Slurm says about a node, as one more signal for a lost host (``launcher="slurm"``).

``host_loss.host_lost`` and ``spare_hosts.move_to_spares`` tell a lost host from a dead process
by probing its sshd (``elastic.probe_host``). Under Slurm the controller knows too: a node
``DOWN``, ``DRAIN``-ed / draining, ``FAIL``-ing, powered down or not responding takes no new
job, so a replacement job pinned there would wait forever. The rule (``host_answers``):

- sshd silent: lost, whatever slurmctld says. slurmctld notices a dead slurmd only after
  ``SlurmdTimeout`` (300 s by default, 30 s on the bed), so its "IDLE"/"ALLOCATED" in the
  first minutes after a host died is stale, not a sign of life. The probe stays the fast
  path: Slurm is not asked at all then.
- sshd answers but Slurm has the node in one of the states above: lost too (nothing can be
  started there: its ranks go to a spare, or the run shrinks).
- sshd answers and Slurm has it in service, or Slurm cannot be asked (no ``scontrol`` on
  the kernel's PATH, no answer within ``SCONTROL_TIMEOUT_S``, a node Slurm does not know
  by that name): the probe's answer stands (a dead process, replaced on its node).
"""

from __future__ import annotations

import logging
import re
import subprocess
from collections.abc import Callable, Collection, Sequence

from workbench.cluster.lifecycle.elastic import probe_host

__all__ = [
    "NO_NEW_JOBS",
    "SCONTROL_TIMEOUT_S",
    "free_nodes",
    "host_answers",
    "node_state",
    "parse_node_state",
    "takes_no_jobs",
    "usable_nodes",
]

log = logging.getLogger("workbench.cluster")

# A healthy slurmctld answers in milliseconds; one that is itself stuck must not hold up
# the decision (the probe has already answered by then).
SCONTROL_TIMEOUT_S = 3.0
# Base states and flags (scontrol's ``State=BASE+FLAG+...``) of a node that starts no job.
NO_NEW_JOBS = frozenset(
    {
        "DOWN",
        "FAIL",
        "FAILING",
        "DRAIN",
        "DRAINING",
        "DRAINED",
        "NOT_RESPONDING",
        "POWERED_DOWN",
        "POWERING_DOWN",
        "POWER_DOWN",
        "FUTURE",
    }
)
_STATE = re.compile(r"(?:^|\s)State=(\S+)")


def parse_node_state(text: str) -> frozenset[str] | None:
    """The base state and flags in ``scontrol show node NAME --oneliner``'s output, e.g.
    ``{"IDLE"}``, ``{"DOWN", "NOT_RESPONDING"}``; a trailing ``*`` (not responding, as
    sinfo writes it) becomes ``NOT_RESPONDING``. None when no ``State=`` is in it."""
    found = _STATE.search(text)
    if found is None:
        return None
    word = found.group(1)
    words = {w for w in word.rstrip("*").upper().split("+") if w}
    if word.endswith("*"):
        words.add("NOT_RESPONDING")
    return frozenset(words)


def node_state(name: str, timeout: float = SCONTROL_TIMEOUT_S) -> frozenset[str] | None:
    """Slurm's state of node ``name`` (``parse_node_state``), or None when Slurm cannot
    say: no ``scontrol`` here, no answer in ``timeout`` s, a name it does not know."""
    argv = ["scontrol", "show", "node", name, "--oneliner"]
    try:
        done = subprocess.run(
            argv, capture_output=True, text=True, timeout=timeout, stdin=subprocess.DEVNULL
        )
    except (OSError, subprocess.TimeoutExpired) as exc:  # no Slurm tools, a stuck slurmctld
        log.debug("%s: %r; the sshd probe decides alone", " ".join(argv), exc)
        return None
    if done.returncode != 0:
        return None
    return parse_node_state(done.stdout)


def takes_no_jobs(state: Collection[str] | None) -> bool:
    """True when Slurm's ``state`` (``node_state``) says the node starts no new job."""
    return state is not None and bool(NO_NEW_JOBS.intersection(state))


def host_answers(
    host: str,
    probe: Callable[[str], bool] = probe_host,
    state: Callable[[str], frozenset[str] | None] | None = None,
) -> bool:
    """``probe`` first (the sshd: the fast signal); when the host answers, also in service
    for Slurm (``state``, ``node_state`` by default; the rule: the module docstring)."""
    if not probe(host):
        return False
    down = (state or node_state)(host)
    if takes_no_jobs(down):
        log.info("host %s answers, but its Slurm node is %s: lost", host, "+".join(sorted(down)))
        return False
    return True


def free_nodes(
    partition: str, exclude: Collection[str], timeout: float = SCONTROL_TIMEOUT_S
) -> Sequence[str] | None:
    """Nodes of ``partition`` (every partition when empty) that Slurm has idle or partly
    allocated and responding (sinfo's ``idle``/``mix`` with no ``*``, ``~`` or other
    flag), less ``exclude``; None when Slurm cannot be asked (then sbatch decides)."""
    argv = ["sinfo", "-h", "-N", "-o", "%N %t"]
    if partition:
        argv += ["-p", partition]
    try:
        done = subprocess.run(
            argv, capture_output=True, text=True, timeout=timeout, stdin=subprocess.DEVNULL
        )
    except (OSError, subprocess.TimeoutExpired):
        return None
    return None if done.returncode != 0 else usable_nodes(done.stdout, exclude)


def usable_nodes(sinfo: str, exclude: Collection[str]) -> list[str]:
    """The nodes ``sinfo -h -N -o "%N %t"`` lists as ``idle`` or ``mix`` (no flag), less
    ``exclude``, each once (a node in two partitions is listed twice)."""
    pairs = [line.split() for line in sinfo.splitlines()]
    usable = [p[0] for p in pairs if len(p) == 2 and p[1] in ("idle", "mix")]
    return [n for n in dict.fromkeys(usable) if n not in exclude]
