"""SQLAlchemy 2 tables of the tuning cache. Bump ``SCHEMA_VERSION`` with any change and add a step
to ``store.MIGRATIONS``."""

from __future__ import annotations

from datetime import datetime

from sqlalchemy import DateTime, Float, Integer, String, Text
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column

SCHEMA_VERSION = 4  # 2: winners.rel_error; 3: winners.spread; 4: winners.busy


class Base(DeclarativeBase):
    pass


class Meta(Base):
    __tablename__ = "attntune_meta"
    name: Mapped[str] = mapped_column(String(64), primary_key=True)
    value: Mapped[str] = mapped_column(Text)


class Winner(Base):
    """One row per tuning key: the fastest valid variant+config measured for it."""

    __tablename__ = "winners"
    key_id: Mapped[str] = mapped_column(String(40), primary_key=True)
    key_json: Mapped[str] = mapped_column(Text)
    arch: Mapped[str] = mapped_column(String(64), index=True)
    dtype: Mapped[str] = mapped_column(String(16))
    mode: Mapped[str] = mapped_column(String(16))
    variant: Mapped[str] = mapped_column(String(64))
    config_json: Mapped[str] = mapped_column(Text)
    median_ms: Mapped[float] = mapped_column(Float)
    tflops: Mapped[float | None] = mapped_column(Float, nullable=True)
    tbps: Mapped[float | None] = mapped_column(Float, nullable=True)
    runner_up: Mapped[str | None] = mapped_column(String(64), nullable=True)
    runner_up_config_json: Mapped[str | None] = mapped_column(Text, nullable=True)
    runner_up_ms: Mapped[float | None] = mapped_column(Float, nullable=True)
    sdpa_default_ms: Mapped[float | None] = mapped_column(Float, nullable=True)
    max_error: Mapped[float | None] = mapped_column(Float, nullable=True)
    rel_error: Mapped[float | None] = mapped_column(Float, nullable=True)  # ||out-ref||/||ref||
    spread: Mapped[float | None] = mapped_column(Float, nullable=True)  # relative noise of median_ms
    busy: Mapped[float | None] = mapped_column(Float, nullable=True)  # share of time waited for a CPU
    fingerprint_json: Mapped[str] = mapped_column(Text)
    trials: Mapped[int] = mapped_column(Integer, default=0)
    tuning_seconds: Mapped[float] = mapped_column(Float, default=0.0)
    created_at: Mapped[datetime] = mapped_column(DateTime)


class Trial(Base):
    """Per-trial summary for inspection (``attntune explain``): what was tried and why it lost."""

    __tablename__ = "trials"
    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    key_id: Mapped[str] = mapped_column(String(40), index=True)
    variant: Mapped[str] = mapped_column(String(64))
    config_json: Mapped[str] = mapped_column(Text)
    status: Mapped[str] = mapped_column(String(16))  # ok | failed | wrong | pruned
    reason: Mapped[str | None] = mapped_column(Text, nullable=True)
    median_ms: Mapped[float | None] = mapped_column(Float, nullable=True)
    max_error: Mapped[float | None] = mapped_column(Float, nullable=True)
    created_at: Mapped[datetime] = mapped_column(DateTime)


class Miss(Base):
    """Keys seen at run time that had no tuned row (for ``attntune tune --from-misses``)."""

    __tablename__ = "misses"
    key_id: Mapped[str] = mapped_column(String(40), primary_key=True)
    key_json: Mapped[str] = mapped_column(Text)
    count: Mapped[int] = mapped_column(Integer, default=1)
    first_seen: Mapped[datetime] = mapped_column(DateTime)
    last_seen: Mapped[datetime] = mapped_column(DateTime)


class Claim(Base):
    """A worker's claim on a key while it tunes it (fleet tuning); expired claims may be retaken."""

    __tablename__ = "claims"
    key_id: Mapped[str] = mapped_column(String(40), primary_key=True)
    owner: Mapped[str] = mapped_column(String(128))
    expires_at: Mapped[datetime] = mapped_column(DateTime)
    done: Mapped[int] = mapped_column(Integer, default=0)
