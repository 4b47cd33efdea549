"""The ledger's tables, as SQLModel models: the schema's single source of truth for code and migrations.

Contract:
- `event` is append-only: the database rejects UPDATE, DELETE and TRUNCATE on it (triggers installed by the
  first migration). `(stream_id, seq)` is gap-free per stream; `(stream_id, idempotency_key)` is unique.
- `stream` holds each stream's head and fence; it is updated only under its own row lock by `ledger_append`.
- `lease` rows are never deleted: an epoch only grows, so a fence once passed stays passed.
- `run` is a projection, derived from events by a trigger in the transaction that appends them.
- `writer_right` and `lease_right` state what each writer kind's login may append and hold; the ledger's
  functions hold those logins to them (migration 0010).
- A migration test checks that the migrated database matches these models exactly.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

from sqlalchemy import (
    BigInteger,
    Column,
    DateTime,
    ForeignKey,
    Index,
    LargeBinary,
    Text,
    UniqueConstraint,
    text,
)
from sqlalchemy.dialects.postgresql import JSONB
from sqlmodel import Field, SQLModel


class Lease(SQLModel, table=True):
    resource: str = Field(sa_column=Column(Text, primary_key=True))
    holder: str = Field(sa_column=Column(Text, nullable=False))
    epoch: int = Field(sa_column=Column(BigInteger, nullable=False))
    expires_at: datetime = Field(sa_column=Column(DateTime(timezone=True), nullable=False))
    # The SHA-256 of the secret its holder chose when it was granted (migration 0007): renewing, releasing or
    # taking it again while live needs that secret.
    secret_sha256: bytes | None = Field(default=None, sa_column=Column(LargeBinary, nullable=True))


class Stream(SQLModel, table=True):
    stream_id: str = Field(sa_column=Column(Text, primary_key=True))
    head_seq: int = Field(sa_column=Column(BigInteger, nullable=False, server_default=text("0")))
    fence_epoch: int = Field(sa_column=Column(BigInteger, nullable=False, server_default=text("0")))
    # The lease whose epochs fence this stream, fixed by its first fenced append.
    fence_resource: str | None = Field(default=None, sa_column=Column(Text, nullable=True))


class Event(SQLModel, table=True):
    __table_args__ = (
        UniqueConstraint("stream_id", "idempotency_key", name="event_stream_key_unique"),
        # Reads of one kind across streams (every checkpoint, every eval result) without scanning the turns.
        Index("event_kind_recorded", "kind", "recorded_at"),
    )

    stream_id: str = Field(sa_column=Column(Text, ForeignKey("stream.stream_id"), primary_key=True))
    seq: int = Field(sa_column=Column(BigInteger, primary_key=True, autoincrement=False))
    idempotency_key: str = Field(sa_column=Column(Text, nullable=False))
    epoch: int = Field(sa_column=Column(BigInteger, nullable=False))
    kind: str = Field(sa_column=Column(Text, nullable=False))
    payload: dict[str, Any] = Field(sa_column=Column(JSONB, nullable=False))
    payload_sha256: bytes = Field(sa_column=Column(LargeBinary, nullable=False))
    recorded_at: datetime = Field(
        sa_column=Column(DateTime(timezone=True), nullable=False, server_default=text("now()"))
    )


class Seat(SQLModel, table=True):
    """Projection: one row per agent seat; the gateway resolves bearer tokens by their SHA-256."""

    seat_id: str = Field(sa_column=Column(Text, primary_key=True))
    token_sha256: bytes = Field(sa_column=Column(LargeBinary, nullable=False, unique=True))
    run_id: str | None = Field(default=None, sa_column=Column(Text, nullable=True))
    episode_id: str | None = Field(default=None, sa_column=Column(Text, nullable=True))
    agent: str = Field(sa_column=Column(Text, nullable=False))
    policy: str = Field(sa_column=Column(Text, nullable=False))
    checkpoint: str | None = Field(default=None, sa_column=Column(Text, nullable=True))
    status: str = Field(sa_column=Column(Text, nullable=False))
    opened_at: datetime = Field(sa_column=Column(DateTime(timezone=True), nullable=False))
    closed_at: datetime | None = Field(default=None, sa_column=Column(DateTime(timezone=True), nullable=True))


class Run(SQLModel, table=True):
    """Projection: one row per run, with its current settings (max_lag, paused, ...)."""

    run_id: str = Field(sa_column=Column(Text, primary_key=True))
    environment: str = Field(sa_column=Column(Text, nullable=False))
    settings: dict[str, Any] = Field(sa_column=Column(JSONB, nullable=False))
    created_at: datetime = Field(sa_column=Column(DateTime(timezone=True), nullable=False))
    updated_seq: int = Field(sa_column=Column(BigInteger, nullable=False))


class WriterRight(SQLModel, table=True):
    """What a writer kind's login may append (migration 0010): events of `kind` to streams starting with
    `stream_prefix`, for logins that are members of `role`."""

    __tablename__ = "writer_right"  # pyright: ignore[reportAssignmentType]  (SQLModel types it as a method)

    role: str = Field(sa_column=Column(Text, primary_key=True))
    kind: str = Field(sa_column=Column(Text, primary_key=True))
    stream_prefix: str = Field(sa_column=Column(Text, primary_key=True))


class LeaseRight(SQLModel, table=True):
    """Which leases a writer kind's login may hold (migration 0010): resources starting with
    `resource_prefix`."""

    __tablename__ = "lease_right"  # pyright: ignore[reportAssignmentType]

    role: str = Field(sa_column=Column(Text, primary_key=True))
    resource_prefix: str = Field(sa_column=Column(Text, primary_key=True))
