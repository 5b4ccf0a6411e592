"""The data pool: durable, indexed storage of agent steps, curation queries and leases.

    from swarm.pool import Pool, StepFilter
    pool = Pool("sqlite:///swarm_pool.db")          # or postgresql+psycopg://...
    lease = pool.lease(StepFilter.trainable("default"), max_groups=8)
    ...; pool.ack(lease.lease_id, consumed_version=new_version)

Type a consumer's ``pool`` with the narrowest role it needs (:mod:`swarm.pool.interfaces`): ``Recorder``,
``Reader``, ``LeaseBook`` (or ``Lookup``); ``Database`` for code running its own SQL on the pool's engine.
See docs/pool.md for the tour and the storage design.
"""

from swarm.pool.curations import Curation, parse_ref
from swarm.pool.engine import Database
from swarm.pool.filter import StepFilter
from swarm.pool.interfaces import LeaseBook, Lookup, Reader, Recorder
from swarm.pool.lease import Lease
from swarm.pool.store import Pool

__all__ = ["Pool", "StepFilter", "Lease", "Curation", "parse_ref", "Database", "Lookup", "Recorder", "Reader",
           "LeaseBook"]
