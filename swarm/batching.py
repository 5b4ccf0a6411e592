"""When an update fires: the five sample-collection strategies, as pure logic over a snapshot.

C1 ``episodes``      enough finished, untrained train episodes;
C2 ``groups``        enough complete groups (every episode of the group ended, at least
                     ``group_size`` finished) — the default;
C3 ``groups_var``    like C2, counting only groups whose rewards are not all equal; the
                     zero-variance groups are excluded from the batch (GRPO learns nothing there);
C4 ``any_agree``     any active client asked for an update (``POST /v1/sync/agree`` on any gateway;
                     the agreements are kept in the pool, :mod:`swarm.pool.agreements`);
C5 ``all_agree``     every active client asked.

The snapshot is built from the pool by the caller (the flow); staleness and eval exclusion are
applied there through the curation filter, so eval episodes and stale steps never reach here.
This module reads nothing and decides nothing else.
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass, field
from enum import StrEnum

__all__ = ["Strategy", "GroupState", "Snapshot", "Decision", "decide"]


class Strategy(StrEnum):
    episodes = "episodes"  # C1
    groups = "groups"  # C2
    groups_var = "groups_var"  # C3
    any_agree = "any_agree"  # C4
    all_agree = "all_agree"  # C5


@dataclass(frozen=True)
class GroupState:
    """One prompt group as the pool sees it now: ended episodes' final rewards, still-open count."""

    group_id: str
    rewards: tuple[float, ...]  # final rewards of finished, untrained episodes
    n_open: int = 0

    def complete(self, group_size: int) -> bool:
        return self.n_open == 0 and len(self.rewards) >= group_size

    @property
    def has_variance(self) -> bool:
        return len(self.rewards) >= 2 and statistics.pvariance(self.rewards) > 0.0


@dataclass(frozen=True)
class Snapshot:
    groups: tuple[GroupState, ...] = ()
    active_clients: frozenset[str] = frozenset()
    agreed_clients: frozenset[str] = frozenset()


@dataclass(frozen=True)
class Decision:
    fire: bool
    group_ids: tuple[str, ...] = ()
    reason: str = ""
    excluded_groups: tuple[str, ...] = field(default=())


def decide(strategy: Strategy | str, snap: Snapshot, *, min_episodes: int = 8, min_groups: int = 2,
           group_size: int = 4) -> Decision:
    """Should an update fire now, and with which groups? Pure; the flow polls it."""
    strategy = Strategy(strategy)
    if strategy is Strategy.episodes:
        ready = [g for g in snap.groups if g.rewards]
        n = sum(len(g.rewards) for g in ready)
        if n >= min_episodes:
            return Decision(True, tuple(g.group_id for g in ready), f"{n} finished episodes >= {min_episodes}")
        return Decision(False, reason=f"{n}/{min_episodes} finished episodes")
    complete = [g for g in snap.groups if g.complete(group_size)]
    if strategy is Strategy.groups:
        if len(complete) >= min_groups:
            return Decision(True, tuple(g.group_id for g in complete), f"{len(complete)} complete groups")
        return Decision(False, reason=f"{len(complete)}/{min_groups} complete groups")
    if strategy is Strategy.groups_var:
        varied = [g for g in complete if g.has_variance]
        flat = tuple(g.group_id for g in complete if not g.has_variance)
        if len(varied) >= min_groups:
            return Decision(True, tuple(g.group_id for g in varied), f"{len(varied)} complete groups with variance",
                            excluded_groups=flat)
        return Decision(False, reason=f"{len(varied)}/{min_groups} complete groups with reward variance",
                        excluded_groups=flat)
    # C4 / C5: clients decide; the batch is every group that is complete now.
    agreed = snap.agreed_clients & snap.active_clients
    if strategy is Strategy.any_agree:
        fire = bool(agreed)
    else:
        fire = bool(snap.active_clients) and agreed == snap.active_clients
    ready_ids = tuple(g.group_id for g in snap.groups if g.rewards and g.n_open == 0)
    if fire and ready_ids:
        return Decision(True, ready_ids, f"{len(agreed)}/{len(snap.active_clients)} active clients agreed")
    return Decision(False, reason=f"{len(agreed)}/{len(snap.active_clients)} active clients agreed, "
                                  f"{len(ready_ids)} groups ready")
