"""What Alembic runs for every migration command: on the connection ``worker.jobs.schema`` hands over.

PostgreSQL: the whole run holds a transaction-scoped advisory lock, so two processes upgrading at once (two
API containers, say) take turns instead of both creating the same table. SQLite: batch mode, since SQLite
alters tables only by copying them.
"""
from __future__ import annotations

from alembic import context
from sqlalchemy import text

from worker.jobs.store import metadata

#: Any number that no other user of the database takes as an advisory lock key.
MIGRATION_LOCK = 7245510
VERSION_TABLE = "mirserve_alembic_version"


def run() -> None:
    connection = context.config.attributes["connection"]
    context.configure(connection=connection, target_metadata=metadata, version_table=VERSION_TABLE,
                      render_as_batch=connection.dialect.name == "sqlite", compare_type=True)
    with context.begin_transaction():
        if connection.dialect.name == "postgresql":
            connection.execute(text(f"SELECT pg_advisory_xact_lock({MIGRATION_LOCK})"))
        context.run_migrations()


run()
