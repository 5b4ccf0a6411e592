"""The pool's SQL schema (SQLAlchemy Core), identical on SQLite and PostgreSQL.

Steps keep their filterable fields as indexed columns and their token sequence as a list of
content-addressed block keys plus an inline tail (see :mod:`swarm.pool.blocks`); the rest of
the record (messages, text, tool calls, timings) is one JSON column. Lease state lives on the
step row (``lease_id``, ``lease_expires_at``, ``consumed_version``) so a claim is one UPDATE.

Tables are created when missing, so a pool written by an older version gains a new table
(``agreements``, ``rewards``) the first time a newer one opens it; a column added to an existing
table is listed in ``ADDED_COLUMNS`` and added by :func:`upgrade` when the pool opens. Nothing is
ever dropped or rewritten: an index that new pools no longer create stays in an older pool, unused.
"""

from __future__ import annotations

from collections.abc import Callable

import sqlalchemy as sa
from sqlalchemy.dialects.postgresql import JSONB

__all__ = ["metadata", "upgrade", "missing_columns", "ADDED_COLUMNS", "episodes", "steps", "blocks", "messages",
           "events", "labels", "leases", "policy_versions", "agreements", "rewards", "curations", "lease_plans",
           "trainer_claims", "feedback_uses", "eval_results", "ID_LEN", "NAME_LEN", "INT32_MAX"]

ID_LEN = 128  # ids (episode, step, group, client, lease, event, label)
NAME_LEN = 256  # task, policy and label names
INT32_MAX = 2**31 - 1  # the largest value of an ``integer`` column (PostgreSQL enforces it)

metadata = sa.MetaData()
JSON = sa.JSON().with_variant(JSONB(), "postgresql")
ID = sa.String(ID_LEN)


def _partial(name: str, *columns: str, where: str) -> sa.Index:
    """An index over the rows where ``where`` holds, on both backends."""
    return sa.Index(name, *columns, sqlite_where=sa.text(where), postgresql_where=sa.text(where))


episodes = sa.Table(
    "episodes",
    metadata,
    sa.Column("episode_id", ID, primary_key=True),
    sa.Column("task", sa.String(NAME_LEN), nullable=False),
    sa.Column("group_id", ID),
    sa.Column("client_id", ID),
    sa.Column("type", sa.String(16), nullable=False),
    sa.Column("status", sa.String(16), nullable=False),
    sa.Column("reward", sa.Double),
    sa.Column("reward_status", sa.String(16), nullable=False),
    sa.Column("timeout_s", sa.Double),
    sa.Column("created_at", sa.Double, nullable=False),
    sa.Column("updated_at", sa.Double, nullable=False),
    sa.Column("ended_at", sa.Double),
    sa.Column("meta", JSON, nullable=False),
    sa.Index("ix_episodes_status_updated", "status", "updated_at"),
    sa.Index("ix_episodes_task", "task"),
    sa.Index("ix_episodes_group", "group_id"),
    sa.Index("ix_episodes_reward_status", "reward_status"),
    sa.Index("ix_episodes_created", "created_at"),
)

steps = sa.Table(
    "steps",
    metadata,
    sa.Column("step_id", ID, primary_key=True),
    sa.Column("episode_id", ID, nullable=False),
    sa.Column("idx", sa.Integer, nullable=False),
    sa.Column("parent_step_id", ID),
    sa.Column("task", sa.String(NAME_LEN), nullable=False),
    sa.Column("group_id", ID),
    sa.Column("policy", sa.String(NAME_LEN), nullable=False),
    sa.Column("policy_version", sa.Integer, nullable=False),
    sa.Column("source", sa.String(16), nullable=False),
    sa.Column("response_id", ID),
    sa.Column("reward", sa.Double),
    sa.Column("reward_status", sa.String(16), nullable=False),
    sa.Column("created_at", sa.Double, nullable=False),
    sa.Column("length", sa.Integer, nullable=False),
    sa.Column("n_prompt", sa.Integer, nullable=False),
    sa.Column("block_keys", sa.LargeBinary, nullable=False),
    sa.Column("tail", sa.LargeBinary, nullable=False),
    sa.Column("logprobs", sa.LargeBinary),
    sa.Column("body", JSON, nullable=False),
    sa.Column("meta", JSON, nullable=False),
    # hash of the record as first written (reward excluded): makes re-adding idempotent
    sa.Column("digest", sa.LargeBinary(16), nullable=False),
    sa.Column("lease_id", ID),
    sa.Column("lease_expires_at", sa.Double),
    sa.Column("consumed_version", sa.Integer),
    sa.Column("consumed_at", sa.Double),
    sa.Index("ix_steps_episode_idx", "episode_id", "idx"),
    sa.Index("ix_steps_group", "group_id"),
    sa.Index("ix_steps_task", "task"),
    sa.Index("ix_steps_policy_version", "policy", "policy_version"),
    # no reward_status index: a step's reward status is its own or its episode's (query.REWARD_FINAL), an OR
    # across both tables that no index of steps answers (older pools keep theirs, unused)
    sa.Index("ix_steps_source", "source"),
    sa.Index("ix_steps_created", "created_at"),
    sa.Index("ix_steps_response_id", "response_id"),
    sa.Index("ix_steps_lease", "lease_id"),
    # what a lease walks: unconsumed steps (of a policy), oldest first, in index order
    _partial("ix_steps_unconsumed_created", "created_at", "step_id", where="consumed_version IS NULL"),
    _partial("ix_steps_unconsumed_policy_created", "policy", "created_at", "step_id", where="consumed_version IS NULL"),
)

blocks = sa.Table(
    "blocks",
    metadata,
    sa.Column("key", sa.LargeBinary(16), primary_key=True),
    sa.Column("tokens", sa.LargeBinary, nullable=False),
    sa.Column("prev", sa.LargeBinary(16)),  # the block before this one (None: the first; unknown in older rows)
    sqlite_with_rowid=False,
)

# each chat message once, chained like the token blocks (swarm.pool.blocks.chain_messages): a step's body names the
# last message of its prompt (``prompt_messages_head``) and reading walks back, so a conversation that grows by two
# messages a turn stores two messages a turn, not the whole history again
messages = sa.Table(
    "messages",
    metadata,
    sa.Column("key", sa.LargeBinary(16), primary_key=True),
    sa.Column("prev", sa.LargeBinary(16)),  # the message before this one (None: the first)
    sa.Column("message", sa.LargeBinary, nullable=False),  # UTF-8 JSON, keys sorted
    sqlite_with_rowid=False,
)

events = sa.Table(
    "events",
    metadata,
    sa.Column("event_id", ID, primary_key=True),
    sa.Column("kind", sa.String(16), nullable=False),
    sa.Column("episode_id", ID),
    sa.Column("step_id", ID),
    sa.Column("created_at", sa.Double, nullable=False),
    sa.Column("record", JSON, nullable=False),
    sa.Index("ix_events_episode", "episode_id"),
    sa.Index("ix_events_step", "step_id"),
    sa.Index("ix_events_kind_created", "kind", "created_at"),  # the trainer's feedback reads, oldest first
)

labels = sa.Table(
    "labels",
    metadata,
    sa.Column("label_id", ID, primary_key=True),
    sa.Column("target", sa.String(16), nullable=False),
    sa.Column("target_id", ID, nullable=False),
    sa.Column("label", sa.String(NAME_LEN), nullable=False),
    sa.Column("exclude", sa.Boolean, nullable=False),
    sa.Column("note", sa.Text, nullable=False),
    sa.Column("created_at", sa.Double, nullable=False),
    sa.Index("ix_labels_target", "target_id", "target"),
    sa.Index("ix_labels_label", "label"),
)

leases = sa.Table(
    "leases",
    metadata,
    sa.Column("lease_id", ID, primary_key=True),
    sa.Column("state", sa.String(16), nullable=False),  # active | acked | released
    sa.Column("n_steps", sa.Integer, nullable=False),
    sa.Column("created_at", sa.Double, nullable=False),
    sa.Column("expires_at", sa.Double, nullable=False),
    sa.Column("consumed_version", sa.Integer),
    sa.Column("filter", JSON, nullable=False),
)

policy_versions = sa.Table(
    "policy_versions",
    metadata,
    sa.Column("policy", sa.String(NAME_LEN), primary_key=True),
    sa.Column("version", sa.Integer, primary_key=True),
    sa.Column("adapter_path", sa.Text),
    sa.Column("created_at", sa.Double, nullable=False),
    sa.Column("meta", JSON, nullable=False),
)

# C4 / C5: a client's request for an update (POST /v1/sync/agree on any gateway of this pool);
# ``taken_at`` is set when an update fires on it (see swarm.pool.agreements)
agreements = sa.Table(
    "agreements",
    metadata,
    sa.Column("agreement_id", ID, primary_key=True),
    sa.Column("client_id", ID, nullable=False),
    sa.Column("created_at", sa.Double, nullable=False),
    sa.Column("taken_at", sa.Double),
    sa.Index("ix_agreements_created", "created_at"),
    _partial("ix_agreements_open", "client_id", where="taken_at IS NULL"),
)

# every reward reported through the gateway, with who gave it (swarm.pool.rewards): agent < judge < admin;
# ``applied`` says whether it became the target's reward (a lower authority never supersedes a higher one)
rewards = sa.Table(
    "rewards",
    metadata,
    sa.Column("reward_id", ID, primary_key=True),
    sa.Column("episode_id", ID, nullable=False),
    sa.Column("step_id", ID),  # None: the episode's reward
    sa.Column("value", sa.Double, nullable=False),
    sa.Column("final", sa.Boolean, nullable=False),
    sa.Column("source", sa.String(16), nullable=False),
    sa.Column("authority", sa.Integer, nullable=False),
    sa.Column("applied", sa.Boolean, nullable=False),
    sa.Column("reason", sa.Text, nullable=False),
    sa.Column("created_at", sa.Double, nullable=False),
    sa.Index("ix_rewards_episode", "episode_id", "created_at"),
)

# named, versioned curations (swarm.pool.curations): a StepFilter saved under a name; saving a changed
# filter under the same name adds version + 1, so a run that trained on "clean@2" can say exactly what it was
curations = sa.Table(
    "curations",
    metadata,
    sa.Column("name", sa.String(NAME_LEN), primary_key=True),
    sa.Column("version", sa.Integer, primary_key=True),
    sa.Column("filter", JSON, nullable=False),
    sa.Column("note", sa.Text, nullable=False),
    sa.Column("created_at", sa.Double, nullable=False),
)

# per trained policy, the filter its trainer's next lease uses (written when the trainer starts waiting),
# so the dashboard shows exactly it and counts what matches now
lease_plans = sa.Table(
    "lease_plans",
    metadata,
    sa.Column("policy", sa.String(NAME_LEN), primary_key=True),
    sa.Column("filter", JSON, nullable=False),
    sa.Column("curation", sa.String(NAME_LEN)),  # "name@version" when the run trains on a saved curation
    sa.Column("version", sa.Integer, nullable=False),  # the trainer's version when it wrote the plan
    sa.Column("updated_at", sa.Double, nullable=False),
)

# per trained policy, the one process training it (swarm.pool.claims): two runs cannot train one policy on one
# pool; the holder heartbeats, and a claim whose heartbeat is older than its ttl (or whose process died) is free
trainer_claims = sa.Table(
    "trainer_claims",
    metadata,
    sa.Column("policy", sa.String(NAME_LEN), primary_key=True),
    sa.Column("holder", sa.String(NAME_LEN), nullable=False),  # host:pid:nonce of the training process
    sa.Column("ttl_s", sa.Double, nullable=False),
    sa.Column("claimed_at", sa.Double, nullable=False),
    sa.Column("heartbeat_at", sa.Double, nullable=False),
)

# which update trained a feedback correction (swarm.pool.feedback): one row per (correction, version it went into)
feedback_uses = sa.Table(
    "feedback_uses",
    metadata,
    sa.Column("event_id", ID, primary_key=True),
    sa.Column("consumed_version", sa.Integer, primary_key=True),
    sa.Column("policy", sa.String(NAME_LEN), nullable=False),
    sa.Column("created_at", sa.Double, nullable=False),
)

# held-out results per policy version (swarm.pool.evals): from a run's own eval groups ("run") or from an
# evaluation of a pinned version or checkpoint ("pinned"); MLflow gets the same numbers
eval_results = sa.Table(
    "eval_results",
    metadata,
    sa.Column("eval_id", ID, primary_key=True),
    sa.Column("policy", sa.String(NAME_LEN), nullable=False),
    sa.Column("version", sa.Integer, nullable=False),
    sa.Column("task", sa.String(NAME_LEN), nullable=False),
    sa.Column("source", sa.String(16), nullable=False),
    sa.Column("episodes", sa.Integer, nullable=False),
    sa.Column("reward", sa.Double),
    sa.Column("metrics", JSON, nullable=False),
    sa.Column("meta", JSON, nullable=False),
    sa.Column("created_at", sa.Double, nullable=False),
    sa.Index("ix_eval_results_policy_version", "policy", "version"),
)


# columns added to tables that older pools already have: (table, column); upgrade() adds them where missing
ADDED_COLUMNS: tuple[tuple[sa.Table, str], ...] = ((blocks, "prev"),)


def missing_columns(conn: sa.Connection) -> list[tuple[sa.Table, sa.Column]]:
    """The ``ADDED_COLUMNS`` this pool's tables lack (an older pool's)."""
    inspector = sa.inspect(conn)
    out = []
    for table, name in ADDED_COLUMNS:
        if name not in {c["name"] for c in inspector.get_columns(table.name)}:
            out.append((table, table.c[name]))
    return out


def upgrade(conn: sa.Connection, add_column: Callable[[sa.Connection, sa.Table, sa.Column], None]) -> list[str]:
    """Add the ``ADDED_COLUMNS`` an older pool lacks (with ``add_column``, the engine's ``ALTER TABLE``);
    returns ``table.column`` of each one added. Run in a write transaction, after the tables exist."""
    added = []
    for table, column in missing_columns(conn):
        add_column(conn, table, column)
        added.append(f"{table.name}.{column.name}")
    return added
