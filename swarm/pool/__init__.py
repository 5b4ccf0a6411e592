"""The data pool: durable, indexed storage of agent steps, curation queries and leases.

    from swarm.pool import Pool, StepFilter
    pool = Pool("sqlite:///swarm_pool.db")          # or postgresql+psycopg://...
    lease = pool.lease(StepFilter.trainable("default"), max_groups=8)
    ...; pool.ack(lease.lease_id, consumed_version=new_version)

See docs/pool.md for the tour and the storage design.
"""

from swarm.pool.filter import StepFilter
from swarm.pool.lease import Lease
from swarm.pool.store import Pool

__all__ = ["Pool", "StepFilter", "Lease"]
