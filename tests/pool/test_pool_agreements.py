"""Client agreements (C4 / C5) in the pool: active window, take exactly once, shared by two Pool handles."""

from __future__ import annotations

import pytest

from swarm.errors import ValidationError
from swarm.pool import Pool
from swarm.records import Episode, now


def test_agreements_are_shared_and_taken_once(pool: Pool, pool_url: str) -> None:
    pool.add_episode(Episode(task="t", group_id="g", client_id="w1"))
    other = Pool(pool_url)  # a second gateway / the trainer on the same database
    try:
        assert other.sync_clients() == ({"w1"}, frozenset())
        other.agree("w2")  # agreeing makes a client active even before its first episode
        pool.agree("w1")
        pool.agree("w1")  # asking twice is one request
        assert pool.sync_clients() == ({"w1", "w2"}, {"w1", "w2"})
        assert other.take_agreements({"w2"}) == {"w2"}
        assert pool.sync_clients()[1] == {"w1"}
        assert pool.take_agreements() == {"w1"}
        assert other.take_agreements() == frozenset()  # nothing is taken twice
        log = other.agreement_log()
        assert sorted(a["client_id"] for a in log) == ["w1", "w2"] and all(a["taken_at"] for a in log)
        pool.agree("w1")  # a new request after the take is a new agreement
        assert [a["client_id"] for a in pool.agreement_log()].count("w1") == 2
    finally:
        other.close()


def test_inactive_clients_drop_out_but_open_agreements_stay(pool: Pool) -> None:
    old = now() - 120
    pool.add_episode(Episode(task="t", client_id="old", created_at=old, updated_at=old))
    pool.agree("gone", at=old)
    pool.add_episode(Episode(task="t", client_id="new"))
    active, agreed = pool.sync_clients(active_window_s=60)
    assert active == {"new"} and agreed == {"gone"}  # decide() only counts agreements of active clients
    assert pool.sync_clients(active_window_s=300)[0] == {"old", "gone", "new"}


@pytest.mark.parametrize("bad", ["", "x" * 129])
def test_bad_client_id_is_refused(pool: Pool, bad: str) -> None:
    with pytest.raises(ValidationError, match="client_id"):
        pool.agree(bad)
