"""The data pool: durable, indexed storage of agent steps, curation queries and leases.

    from swarm.pool import StepFilter, open_pool
    pool = open_pool("sqlite:///swarm_pool.db")     # or postgresql+psycopg://...; Pool(url) also works
    lease = pool.lease(StepFilter.trainable("default"), max_groups=8)
    ...; pool.ack(lease.lease_id, consumed_version=new_version)

This package is the pool's public face: code outside it imports from here, never from its modules
(an import-linter contract holds the app's side to it). Type a consumer's ``pool`` with the roles it
uses (:mod:`swarm.pool.roles`: ``Lookup``, ``Recorder``, ``Annotator``, ``Reader``, ``LeaseBook``, ``Versions``,
``Claims``, ``Agreements``, ``Feedback``, ``Monitor``), each a few methods, not with ``Pool``. A database is
a pool engine (:mod:`swarm.pool.engines`): one module declaring its settings and its dialect.
See docs/pool.md for the tour and the storage design.
"""

from swarm.pool.curations import Curation, parse_ref
from swarm.pool.engine import WriteBusy
from swarm.pool.engines import ENGINES, Dialect, EngineSection
from swarm.pool.episodes import Ended, EpisodeEnding
from swarm.pool.evals import EvalResult, eval_summary, record_run_evals
from swarm.pool.feedback import CORRECTION_KEY, Correction, Rating
from swarm.pool.filter import StepFilter
from swarm.pool.heads import EpisodeHead
from swarm.pool.lease import Lease
from swarm.pool.overview import Overview
from swarm.pool.rewards import AUTHORITY, RewardOutcome
from swarm.pool.roles import (
    Agreements,
    Annotator,
    Claims,
    Feedback,
    LeaseBook,
    Lookup,
    Monitor,
    Reader,
    Recorder,
    Served,
    Versions,
)
from swarm.pool.schema import ID_LEN, INT32_MAX, NAME_LEN
from swarm.pool.store import Pool, open_pool

__all__ = [
    "Pool", "open_pool", "ENGINES", "Dialect", "EngineSection",
    "Lookup", "Recorder", "Annotator", "Reader", "LeaseBook", "Versions", "Claims", "Agreements", "Feedback", "Monitor",
    "Served",
    "StepFilter", "Lease", "Curation", "parse_ref", "EpisodeEnding", "Ended", "EpisodeHead", "RewardOutcome", "AUTHORITY",
    "EvalResult", "eval_summary", "record_run_evals", "Rating", "Correction", "CORRECTION_KEY", "Overview",
    "ID_LEN", "INT32_MAX", "NAME_LEN", "WriteBusy",
]
