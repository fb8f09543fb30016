"""Database engine set-up: SQLite in WAL mode by default, any SQLAlchemy URL (PostgreSQL via psycopg) otherwise.

SQLite allows one writer at a time. Python's sqlite3 module opens transactions lazily with a plain ``BEGIN``,
so two writers can both read, then both try to upgrade their lock, and one fails with "database is locked"
regardless of the busy timeout. Write transactions here therefore start with ``BEGIN IMMEDIATE`` (they take the
write lock first and wait for it up to ``busy_timeout``); reads use a deferred ``BEGIN`` and never block writers
in WAL mode.
"""
from __future__ import annotations

import contextlib
import sqlite3
import time
from datetime import datetime, timezone
from pathlib import Path
from typing import Iterator

from sqlalchemy import DateTime, Engine, TypeDecorator, create_engine, event
from sqlalchemy.engine import Connection, make_url

SQLITE_BUSY_TIMEOUT_MS = 10_000
_BEGIN_OPTION = "mirserve_sqlite_begin"


class UTCDateTime(TypeDecorator):
    """Timezone-aware UTC datetimes on every backend (SQLite stores naive text, PostgreSQL timestamptz)."""

    impl = DateTime(timezone=True)
    cache_ok = True

    def process_bind_param(self, value, dialect):
        if value is None:
            return None
        if value.tzinfo is None:
            raise ValueError("naive datetimes are not stored; use datetime.now(timezone.utc)")
        value = value.astimezone(timezone.utc)
        return value.replace(tzinfo=None) if dialect.name == "sqlite" else value

    def process_result_value(self, value, dialect):
        if value is None:
            return None
        return value.replace(tzinfo=timezone.utc) if value.tzinfo is None else value.astimezone(timezone.utc)


def utcnow() -> datetime:
    return datetime.now(timezone.utc)


def create_db_engine(url: str) -> Engine:
    """An engine for ``url``; for SQLite, the parent directory is created and WAL mode is switched on."""
    parsed = make_url(url)
    if parsed.get_backend_name() != "sqlite":
        return create_engine(url, pool_pre_ping=True, pool_size=5, max_overflow=10)
    if parsed.database and parsed.database != ":memory:":
        Path(parsed.database).parent.mkdir(parents=True, exist_ok=True)
    engine = create_engine(url, pool_size=8, max_overflow=16, pool_timeout=30)
    _configure_sqlite(engine)
    return engine


def _configure_sqlite(engine: Engine) -> None:
    @event.listens_for(engine, "connect")
    def _on_connect(dbapi_connection, _record):
        # Take transaction control away from the sqlite3 module so that the "begin" hook below decides.
        dbapi_connection.isolation_level = None
        cursor = dbapi_connection.cursor()
        cursor.execute(f"PRAGMA busy_timeout = {SQLITE_BUSY_TIMEOUT_MS}")
        _ensure_wal(cursor)
        cursor.execute("PRAGMA synchronous = NORMAL")
        cursor.close()

    @event.listens_for(engine, "begin")
    def _on_begin(conn: Connection):
        mode = conn.get_execution_options().get(_BEGIN_OPTION, "DEFERRED")
        conn.exec_driver_sql(f"BEGIN {mode}")


def _ensure_wal(cursor) -> None:
    """Switch the file to WAL (a persistent property of the file) unless it already is.

    The switch needs the write lock and SQLite answers "locked" at once instead of waiting when two fresh
    connections race for it (the API and a worker starting together), hence the retry loop.
    """
    deadline = time.monotonic() + SQLITE_BUSY_TIMEOUT_MS / 1000
    while True:
        try:
            if cursor.execute("PRAGMA journal_mode").fetchone()[0].lower() != "wal":
                cursor.execute("PRAGMA journal_mode = WAL")
            return
        except sqlite3.OperationalError as error:
            if "locked" not in str(error) or time.monotonic() > deadline:
                raise
            time.sleep(0.02)


@contextlib.contextmanager
def write_transaction(engine: Engine) -> Iterator[Connection]:
    """A transaction that will write: ``BEGIN IMMEDIATE`` on SQLite, a plain transaction elsewhere."""
    with engine.connect() as conn:
        conn = conn.execution_options(**{_BEGIN_OPTION: "IMMEDIATE"})
        with conn.begin():
            yield conn


@contextlib.contextmanager
def read_transaction(engine: Engine) -> Iterator[Connection]:
    with engine.connect() as conn:
        with conn.begin():
            yield conn
