"""Ledger tables (SQLAlchemy 2). Alembic revisions in migrations/ create exactly these.

Units: seconds for durations, GPU-hours for cost, UTC for times. Run and attempt states
(`ggpo_batch.contracts.states`) are changed only through `Ledger` transitions, each of which appends an
`events` row.
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

from sqlalchemy import (
    JSON,
    BigInteger,
    Boolean,
    DateTime,
    Float,
    ForeignKey,
    Index,
    Integer,
    String,
    Text,
    UniqueConstraint,
    text,
)
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column, relationship
from sqlalchemy.types import TypeDecorator

from ..common.limits import (
    ARM_NAME_MAX,
    EVALUATION_KEY_MAX,
    NAME_COLUMN_LENGTH,
    NAME_MAX,
    RUN_KEY_MAX,
    USER_MAX,
    WORKER_NAME_MAX,
)
from ..contracts.priorities import DEFAULT_PRIORITY, PRIORITY_COLUMN_LENGTH

NOTICE_KEY_LENGTH = 255  # a notification's keys (ggpo_batch/contracts/notices.py keeps them shorter)


def utcnow() -> datetime:
    return datetime.now(UTC)


class UTCDateTime(TypeDecorator):
    """Timezone-aware UTC datetimes on both SQLite (which stores naive text) and PostgreSQL."""

    impl = DateTime(timezone=True)
    cache_ok = True

    def process_bind_param(self, value: datetime | None, dialect: Any) -> datetime | None:
        if value is None:
            return None
        if value.tzinfo is None:
            raise ValueError("naive datetime given to the ledger; use timezone-aware UTC")
        return value.astimezone(UTC)

    def process_result_value(self, value: datetime | None, dialect: Any) -> datetime | None:
        if value is None:
            return None
        return value.replace(tzinfo=UTC) if value.tzinfo is None else value.astimezone(UTC)


# When an attempt's GPU-hours count (`costs`): its end, or while it runs its creation.
BOOKED_AT_SQL = "coalesce(ended_at, created_at)"


class Base(DeclarativeBase):
    type_annotation_map = {datetime: UTCDateTime, dict[str, Any]: JSON}


class Experiment(Base):
    __tablename__ = "experiments"
    __table_args__ = (UniqueConstraint("name", "version", name="uq_experiment_name_version"),)

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    name: Mapped[str] = mapped_column(String(NAME_COLUMN_LENGTH))
    version: Mapped[int] = mapped_column(Integer, default=1)
    method: Mapped[str] = mapped_column(String(64))
    source: Mapped[str] = mapped_column(String(16))  # spec | import
    source_path: Mapped[str | None] = mapped_column(Text)
    spec_hash: Mapped[str] = mapped_column(String(64))
    # Deferred: a big spec (1,000 seeds) must not be decoded for every run row that joins it.
    spec: Mapped[dict[str, Any]] = mapped_column(JSON, deferred=True)
    queue: Mapped[str | None] = mapped_column(String(NAME_MAX))
    gpus: Mapped[int] = mapped_column(Integer)
    max_gpu_hours: Mapped[float | None] = mapped_column(Float)
    created_by: Mapped[str] = mapped_column(String(USER_MAX))
    created_at: Mapped[datetime] = mapped_column(default=utcnow)

    runs: Mapped[list[Run]] = relationship(back_populates="experiment", order_by="Run.id")


class Run(Base):
    __tablename__ = "runs"
    __table_args__ = (UniqueConstraint("experiment_id", "arm", "seed", name="uq_run_experiment_arm_seed"),
                      # status totals come from this index alone (migration 0002)
                      Index("ix_runs_status_totals", "experiment_id", "arm", "state", "estimated_gpu_hours"))

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    experiment_id: Mapped[int] = mapped_column(ForeignKey("experiments.id", ondelete="CASCADE"), index=True)
    run_key: Mapped[str] = mapped_column(String(RUN_KEY_MAX), unique=True)
    arm: Mapped[str] = mapped_column(String(ARM_NAME_MAX))
    seed: Mapped[int] = mapped_column(BigInteger)
    state: Mapped[str] = mapped_column(String(16), index=True)
    config_hash: Mapped[str] = mapped_column(String(64))
    run_spec: Mapped[dict[str, Any]] = mapped_column(JSON)
    retries_allowed: Mapped[int] = mapped_column(Integer, default=0)
    estimated_gpu_hours: Mapped[float | None] = mapped_column(Float)
    # high | normal | low (ggpo_batch/contracts/priorities.py): which RQ queue the run waits on, and its Slurm
    # nice/QoS (migration 0006).
    priority: Mapped[str] = mapped_column(String(PRIORITY_COLUMN_LENGTH), default=DEFAULT_PRIORITY,
                                          server_default=DEFAULT_PRIORITY)
    cause: Mapped[str | None] = mapped_column(Text)
    worker: Mapped[str | None] = mapped_column(String(WORKER_NAME_MAX))
    result: Mapped[dict[str, Any] | None] = mapped_column(JSON)
    # The evaluation's figures (ggpo_batch/contracts/outcome.py), booked with the result (migration 0003).
    # Deferred: per-item rewards are the report's to read, not every query's that loads runs.
    outcome: Mapped[dict[str, Any] | None] = mapped_column(JSON, deferred=True)
    created_at: Mapped[datetime] = mapped_column(default=utcnow)
    updated_at: Mapped[datetime] = mapped_column(default=utcnow)

    experiment: Mapped[Experiment] = relationship(back_populates="runs", lazy="joined", innerjoin=True)
    attempts: Mapped[list[Attempt]] = relationship(back_populates="run", order_by="Attempt.number", lazy="selectin")
    # Loaded only where asked for (status's pages): the provenance of the run's attempts, oldest first.
    provenances: Mapped[list[AttemptProvenance]] = relationship(order_by="AttemptProvenance.attempt_id",
                                                                lazy="raise", viewonly=True)


class Attempt(Base):
    """One allocation of a run: one Slurm job (or local/debug process), with its own GPU-hours."""

    __tablename__ = "attempts"
    __table_args__ = (UniqueConstraint("run_id", "number", name="uq_attempt_run_number"),
                      # `costs --since`: the time an attempt's GPU-hours are booked at (migration 0006)
                      Index("ix_attempts_booked_at", text(BOOKED_AT_SQL)))

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    run_id: Mapped[int] = mapped_column(ForeignKey("runs.id", ondelete="CASCADE"), index=True)
    number: Mapped[int] = mapped_column(Integer)
    executor: Mapped[str] = mapped_column(String(16))
    # What its GPU-hours were spent on (states.ATTEMPT_KINDS): training, the continuation of the
    # run past a time limit (migration 0005; older attempts are training), or an evaluation after
    # training, whose row `evaluation_id` names (migration 0008).
    kind: Mapped[str] = mapped_column(String(16), default="training", server_default="training")
    evaluation_id: Mapped[int | None] = mapped_column(ForeignKey("evaluations.id", ondelete="CASCADE"), index=True)
    job_id: Mapped[str | None] = mapped_column(String(64), index=True)
    state: Mapped[str] = mapped_column(String(16))
    scheduler_state: Mapped[str | None] = mapped_column(String(32))
    reason: Mapped[str | None] = mapped_column(Text)
    submitted_by: Mapped[str] = mapped_column(String(USER_MAX))
    worker: Mapped[str | None] = mapped_column(String(WORKER_NAME_MAX))
    gpus: Mapped[int] = mapped_column(Integer)
    created_at: Mapped[datetime] = mapped_column(default=utcnow)
    submitted_at: Mapped[datetime | None] = mapped_column()
    started_at: Mapped[datetime | None] = mapped_column()
    ended_at: Mapped[datetime | None] = mapped_column()
    elapsed_seconds: Mapped[float | None] = mapped_column(Float)
    # The job's own figure (gpus x its elapsed through evaluation) and the scheduler's
    # (AllocTRES gres/gpu x ElapsedRaw), kept side by side so a disagreement is visible.
    gpu_hours_job: Mapped[float | None] = mapped_column(Float)
    gpu_hours_scheduler: Mapped[float | None] = mapped_column(Float)
    exit_code: Mapped[str | None] = mapped_column(String(32))
    # The job's last heartbeat (ggpo_batch/contracts/heartbeat.py), copied by reconcile while it runs
    # (migration 0004): an observation, not a transition, so no event row. `heartbeat_at` is
    # the job's own time of writing it.
    heartbeat_step: Mapped[int | None] = mapped_column(Integer)
    heartbeat_loop_seconds: Mapped[float | None] = mapped_column(Float)
    heartbeat_budget_seconds: Mapped[float | None] = mapped_column(Float)
    heartbeat_mean_reward: Mapped[float | None] = mapped_column(Float)
    heartbeat_tokens_per_second: Mapped[float | None] = mapped_column(Float)
    heartbeat_at: Mapped[datetime | None] = mapped_column()

    run: Mapped[Run] = relationship(back_populates="attempts")


class Evaluation(Base):
    """One evaluation of a succeeded run's exported policy on a data file, after training: its
    outcome set `name` for that run (ggpo_batch/control/evaluations.py; migration 0008). Its attempts (kind
    `evaluation`) carry its GPU-hours; the run stays succeeded."""

    __tablename__ = "evaluations"
    __table_args__ = (UniqueConstraint("run_id", "name", name="uq_evaluation_run_name"),
                      Index("ix_evaluations_state", "state"))

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    run_id: Mapped[int] = mapped_column(ForeignKey("runs.id", ondelete="CASCADE"), index=True)
    # `<run key>-eval_<name>`: its RQ job id (limits.EVALUATION_KEY_INFIX)
    key: Mapped[str] = mapped_column(String(EVALUATION_KEY_MAX), unique=True)
    name: Mapped[str] = mapped_column(String(ARM_NAME_MAX))
    state: Mapped[str] = mapped_column(String(16))  # states.EVALUATION_STATES
    source: Mapped[str] = mapped_column(String(16))  # command (`evaluate`) | spec ([[evaluations]], at settlement)
    # What the job is given (evaluation_spec.EvaluationSpec, plain JSON): data file and its sha256,
    # GPUs, the policy and the training details it reads, the run's spec.
    spec: Mapped[dict[str, Any]] = mapped_column(JSON)
    gpus: Mapped[int] = mapped_column(Integer)
    cause: Mapped[str | None] = mapped_column(Text)
    # The outcome figures (ggpo_batch/contracts/outcome.py) of this set for this run, and the job's evaluation
    # record without its per-item rows; deferred: the report's to read.
    outcome: Mapped[dict[str, Any] | None] = mapped_column(JSON, deferred=True)
    record: Mapped[dict[str, Any] | None] = mapped_column(JSON, deferred=True)
    created_by: Mapped[str] = mapped_column(String(USER_MAX))
    created_at: Mapped[datetime] = mapped_column(default=utcnow)
    updated_at: Mapped[datetime] = mapped_column(default=utcnow)

    run: Mapped[Run] = relationship(lazy="joined", innerjoin=True)
class AttemptProvenance(Base):
    """What an attempt ran (ggpo_batch/contracts/provenance.py): code, environment, hardware, spec hash;
    written by its job, booked by settlement with the attempt's end (migration 0009)."""

    __tablename__ = "attempt_provenance"

    attempt_id: Mapped[int] = mapped_column(ForeignKey("attempts.id", ondelete="CASCADE"), primary_key=True)
    run_id: Mapped[int] = mapped_column(ForeignKey("runs.id", ondelete="CASCADE"), index=True)
    document: Mapped[dict[str, Any]] = mapped_column(JSON)  # without the distributions list
    # Every installed `name==version`: read only to name the distributions two runs differ in.
    distributions: Mapped[dict[str, Any] | None] = mapped_column(JSON, deferred=True)


class CurvePoint(Base):
    """One training step of a run's learning curve (ggpo_batch/contracts/curve.py): booked in bulk by
    settlement from the details' history (migration 0009); `attempt_id` is the attempt that booked it."""

    __tablename__ = "curve_points"

    run_id: Mapped[int] = mapped_column(ForeignKey("runs.id", ondelete="CASCADE"), primary_key=True)
    step: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=False)
    attempt_id: Mapped[int] = mapped_column(ForeignKey("attempts.id", ondelete="CASCADE"))
    loop_seconds: Mapped[float | None] = mapped_column(Float)
    mean_reward: Mapped[float | None] = mapped_column(Float)
    kl: Mapped[float | None] = mapped_column(Float)
    loss: Mapped[float | None] = mapped_column(Float)
    clip_fraction: Mapped[float | None] = mapped_column(Float)
    tokens_per_second: Mapped[float | None] = mapped_column(Float)
    gradient_norm: Mapped[float | None] = mapped_column(Float)
    mean_length: Mapped[float | None] = mapped_column(Float)
    logprob_gap_mean: Mapped[float | None] = mapped_column(Float)
    logprob_gap_p99: Mapped[float | None] = mapped_column(Float)
    is_weight_mean: Mapped[float | None] = mapped_column(Float)
    weight_sync_seconds: Mapped[float | None] = mapped_column(Float)
    probe_gap: Mapped[float | None] = mapped_column(Float)


class SequentialLook(Base):
    """One look of a sequential [power] design at one arm (ggpo_batch/control/waves.py, migration
    0012): the paired t statistic of the arm against the baseline over the seeds of waves 1..look,
    the |t| boundary of that look, the per-seed differences used, and what reconcile decided:
    crossed or futile (the arm's held runs cancelled), continue (the next wave released), final
    (the last look, not crossed) or refused (the cost guard refused the next wave). Append-only."""

    __tablename__ = "sequential_looks"
    __table_args__ = (UniqueConstraint("experiment_id", "arm", "look", name="uq_look_experiment_arm_look"),)

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    experiment_id: Mapped[int] = mapped_column(ForeignKey("experiments.id", ondelete="CASCADE"), index=True)
    arm: Mapped[str] = mapped_column(String(ARM_NAME_MAX))
    look: Mapped[int] = mapped_column(Integer)  # 1..looks
    looks: Mapped[int] = mapped_column(Integer)
    seeds: Mapped[int] = mapped_column(Integer)  # the seeds the design's wave `look` reaches
    seeds_paired: Mapped[int] = mapped_column(Integer)  # of them, paired with the baseline (the statistic's n)
    metric: Mapped[str] = mapped_column(String(64))
    statistic: Mapped[float | None] = mapped_column(Float)  # t; None: fewer than 2 seeds paired, or infinite
    boundary: Mapped[float | None] = mapped_column(Float)  # |t| boundary; None: this look cannot reject
    alpha: Mapped[float] = mapped_column(Float)  # the per-arm level the boundaries spend
    spending: Mapped[str] = mapped_column(String(32))
    waves: Mapped[dict[str, Any]] = mapped_column(JSON)  # the design's waves (a list)
    per_seed: Mapped[dict[str, Any]] = mapped_column(JSON)  # seed -> the arm's difference to the baseline
    decision: Mapped[str] = mapped_column(String(16))
    reason: Mapped[str | None] = mapped_column(Text)
    decided_by: Mapped[str] = mapped_column(String(USER_MAX))
    decided_at: Mapped[datetime] = mapped_column(default=utcnow)


class Canary(Base):
    """The canary of one shape of an experiment version (contracts/canary_spec.py, migration 0013): the
    run it stands for (whose attempts of kind `canary` carry its GPU-hours), its state, why it failed,
    and the record its job wrote (each check's name, figures, passed)."""

    __tablename__ = "canaries"
    __table_args__ = (UniqueConstraint("key", name="uq_canary_key"), UniqueConstraint("run_id", name="uq_canary_run"))

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    experiment_id: Mapped[int] = mapped_column(ForeignKey("experiments.id", ondelete="CASCADE"), index=True)
    run_id: Mapped[int] = mapped_column(ForeignKey("runs.id", ondelete="CASCADE"))
    key: Mapped[str] = mapped_column(String(220))  # `<run key>-canary`: its RQ job id
    shape: Mapped[dict[str, Any]] = mapped_column(JSON)
    spec: Mapped[dict[str, Any]] = mapped_column(JSON)  # canary_spec.CanarySpec, plain JSON
    state: Mapped[str] = mapped_column(String(16))  # canary_spec.CANARY_STATES
    gpus: Mapped[int] = mapped_column(Integer)
    reason: Mapped[str | None] = mapped_column(Text)
    record: Mapped[dict[str, Any] | None] = mapped_column(JSON, deferred=True)
    created_by: Mapped[str] = mapped_column(String(USER_MAX))
    created_at: Mapped[datetime] = mapped_column(default=utcnow)
    updated_at: Mapped[datetime] = mapped_column(default=utcnow)

    run: Mapped[Run] = relationship(lazy="joined", innerjoin=True)


class Event(Base):
    """Append-only: every state transition of a run or attempt, and every decision."""

    __tablename__ = "events"

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    at: Mapped[datetime] = mapped_column(default=utcnow)
    experiment_id: Mapped[int | None] = mapped_column(ForeignKey("experiments.id", ondelete="CASCADE"), index=True)
    run_id: Mapped[int | None] = mapped_column(ForeignKey("runs.id", ondelete="CASCADE"), index=True)
    attempt_id: Mapped[int | None] = mapped_column(ForeignKey("attempts.id", ondelete="CASCADE"))
    entity: Mapped[str] = mapped_column(String(16))  # experiment | run | attempt | decision | cleanup (files removed)
    from_state: Mapped[str | None] = mapped_column(String(32))
    to_state: Mapped[str] = mapped_column(String(32))
    actor: Mapped[str] = mapped_column(String(USER_MAX))
    reason: Mapped[str | None] = mapped_column(Text)


class Decision(Base):
    """A deliberate choice about cost: not reproduced because too expensive, or cost accepted."""

    __tablename__ = "decisions"

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    experiment_id: Mapped[int | None] = mapped_column(ForeignKey("experiments.id", ondelete="CASCADE"), index=True)
    experiment_name: Mapped[str] = mapped_column(String(NAME_COLUMN_LENGTH), index=True)
    kind: Mapped[str] = mapped_column(String(32))  # not_reproduced_high_cost | cost_accepted
    estimated_gpu_hours: Mapped[float | None] = mapped_column(Float)
    cap_gpu_hours: Mapped[float | None] = mapped_column(Float)
    cost_basis: Mapped[str | None] = mapped_column(Text)
    cost_type: Mapped[str | None] = mapped_column(Text)
    available_budget: Mapped[str | None] = mapped_column(Text)
    resolution: Mapped[str | None] = mapped_column(Text)
    review_done: Mapped[bool] = mapped_column(Boolean, default=False)
    automatic_retry: Mapped[bool] = mapped_column(Boolean, default=False)
    decided_by: Mapped[str] = mapped_column(String(USER_MAX))
    decided_at: Mapped[datetime] = mapped_column(default=utcnow)
    reason: Mapped[str | None] = mapped_column(Text)


class Artifact(Base):
    __tablename__ = "artifacts"

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    path: Mapped[str] = mapped_column(Text)
    sha256: Mapped[str] = mapped_column(String(64))
    size_bytes: Mapped[int] = mapped_column(BigInteger)
    kind: Mapped[str] = mapped_column(String(32))  # run_record | component_record | plot | ...
    run_id: Mapped[int | None] = mapped_column(ForeignKey("runs.id", ondelete="CASCADE"), index=True)
    component_run_id: Mapped[int | None] = mapped_column(ForeignKey("component_runs.id", ondelete="CASCADE"))
    created_at: Mapped[datetime] = mapped_column(default=utcnow)


class ComponentRun(Base):
    """One nightly CPU component run of a method at a tier (a seed-003 record)."""

    __tablename__ = "component_runs"
    __table_args__ = (UniqueConstraint("method", "tier", "night", name="uq_component_method_tier_night"),)

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    method: Mapped[str] = mapped_column(String(64))
    tier: Mapped[str] = mapped_column(String(32))
    night: Mapped[str] = mapped_column(String(10))  # YYYY-MM-DD the run is for (the once-per-night guard)
    state: Mapped[str] = mapped_column(String(16))  # claimed | succeeded | failed
    started_at: Mapped[datetime] = mapped_column(default=utcnow)
    finished_at: Mapped[datetime | None] = mapped_column()
    seconds: Mapped[float | None] = mapped_column(Float)
    commit: Mapped[str | None] = mapped_column(String(64))
    dirty: Mapped[bool | None] = mapped_column(Boolean)
    record: Mapped[dict[str, Any] | None] = mapped_column(JSON)
    error: Mapped[str | None] = mapped_column(Text)
    actor: Mapped[str] = mapped_column(String(USER_MAX))


class Notification(Base):
    """The outbox (migration 0007): one row per event to tell people about, written in the
    transaction of the transition it reports, or by reconcile for what it observes; `dedupe_key`
    unique, so each event is recorded once. Reconcile delivers it (ggpo_batch/notify/delivery.py)."""

    __tablename__ = "notifications"
    __table_args__ = (UniqueConstraint("dedupe_key", name="uq_notifications_dedupe_key"),)

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    dedupe_key: Mapped[str] = mapped_column(String(NOTICE_KEY_LENGTH))
    # What receivers get as Idempotency-Key / Message-ID: the dedupe key and a random part.
    key: Mapped[str] = mapped_column(String(NOTICE_KEY_LENGTH))
    kind: Mapped[str] = mapped_column(String(32))
    subject: Mapped[str] = mapped_column(Text)
    fields: Mapped[dict[str, Any]] = mapped_column(JSON)
    experiment_id: Mapped[int | None] = mapped_column(Integer, index=True)
    created_at: Mapped[datetime] = mapped_column(default=utcnow)
    # When a delivery is next due; NULL: nothing left to do (delivered everywhere, or given up).
    next_try_at: Mapped[datetime | None] = mapped_column(index=True)


class NotificationDelivery(Base):
    """One notification's delivery to one sink (a webhook, an e-mail relay): tries and outcome."""

    __tablename__ = "notification_deliveries"
    __table_args__ = (UniqueConstraint("notification_id", "sink", name="uq_delivery_notification_sink"),
                      Index("ix_deliveries_sink_state", "sink", "state"))

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    notification_id: Mapped[int] = mapped_column(ForeignKey("notifications.id", ondelete="CASCADE"))
    sink: Mapped[str] = mapped_column(String(64))
    state: Mapped[str] = mapped_column(String(16))  # retrying | delivered | failed
    tries: Mapped[int] = mapped_column(Integer, default=0)
    next_try_at: Mapped[datetime | None] = mapped_column()
    last_error: Mapped[str | None] = mapped_column(Text)
    delivered_at: Mapped[datetime | None] = mapped_column()
