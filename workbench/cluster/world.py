"""``World``: the ranks of one process group, frozen. A change makes a new ``World``.

``Cluster`` owns its current ``World`` and is the only one that replaces it; the dispatch and
the direct-cell routes read it through a getter the cluster hands them, so they always see
a whole world (never a list half renumbered by a recovery). The start, a recovery and a grow
make new worlds from the one they were given and hand each back (``Commit``).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

from workbench.cluster.lifecycle.elastic import grown_ranks, shrunk_ranks
from workbench.cluster.ranks import RankAssignment

__all__ = ["Commit", "World"]

# A world a step made from the cluster's (``replaced``, ``shrunk``, ``grown``), handed to the
# cluster, whose world it becomes at once (what a step left half done is what the next sees).
Commit = Callable[["World"], None]


@dataclass(frozen=True, slots=True)
class World:
    """The ranks in rank order, and how many times the world was replaced (``generation``:
    every start, recovery, shrink or grow makes the next one)."""

    ranks: tuple[RankAssignment, ...] = ()
    generation: int = 0

    @property
    def master(self) -> tuple[str, int] | None:
        """Where the rendezvous store listens (rank 0's ``MASTER_ADDR``/``MASTER_PORT``)."""
        if not self.ranks:
            return None
        return self.ranks[0].master_addr, self.ranks[0].master_port

    @property
    def size(self) -> int:
        return len(self.ranks)

    def replaced(self, ranks: Sequence[RankAssignment]) -> World:
        """The next world, made of ``ranks``."""
        return World(tuple(ranks), self.generation + 1)

    def shrunk(self, drop: Sequence[int]) -> World:
        """Without the ranks ``drop``, the rest renumbered 0..n-1 (``elastic.shrunk_ranks``)."""
        return self.replaced(shrunk_ranks(list(self.ranks), list(drop)))

    def grown(self, added: Sequence[RankAssignment]) -> World:
        """With ``added`` as the new last ranks (``elastic.grown_ranks``)."""
        return self.replaced(grown_ranks(list(self.ranks), list(added)))
