"""The job tables' schema: upgrading a database to this code's revision, and refusing one that is not there.

Revisions live in ``worker/jobs/migrations/versions`` (Alembic). ``mirserve db upgrade`` applies them;
``mirserve serve`` upgrades its own SQLite database at start; ``mirserve api`` and ``mirserve worker`` refuse
a database whose revision is not this code's, saying which command to run. A database created before
migrations existed (the tables without a version table) is taken as the first revision.
"""
from __future__ import annotations

import functools
from pathlib import Path

from alembic import command
from alembic.config import Config
from alembic.runtime.migration import MigrationContext
from alembic.script import ScriptDirectory
from sqlalchemy import Engine, inspect

from worker.jobs.db import write_transaction

MIGRATIONS = Path(__file__).with_name("migrations")
#: The version table; named for mirserve so that a database shared with another Alembic user stays apart.
VERSION_TABLE = "mirserve_alembic_version"
FIRST_REVISION = "0001"
UPGRADE_COMMAND = "mirserve db upgrade"


class SchemaError(RuntimeError):
    """The database's schema is not the one this code needs; the message says what to run."""


def _config(connection=None) -> Config:
    config = Config()
    config.set_main_option("script_location", str(MIGRATIONS))
    config.attributes["connection"] = connection
    return config


@functools.cache
def _scripts() -> ScriptDirectory:
    """The revision scripts, read once per process (each read imports every revision file)."""
    return ScriptDirectory.from_config(_config())


def head_revision() -> str:
    return _scripts().get_current_head()


def revisions() -> list[str]:
    """Every revision, oldest first."""
    return [script.revision for script in reversed(list(_scripts().walk_revisions()))]


def current_revision(engine: Engine) -> str | None:
    """The database's revision; None for an empty database (or one older than migrations, see ``status``)."""
    with engine.connect() as connection:
        return MigrationContext.configure(connection, opts={"version_table": VERSION_TABLE}).get_current_revision()


def _predates_migrations(connection) -> bool:
    tables = set(inspect(connection).get_table_names())
    return "mirserve_jobs" in tables and VERSION_TABLE not in tables


def upgrade(engine: Engine, revision: str = "head") -> str:
    """Apply every revision up to ``revision``; returns the database's revision afterwards."""
    with write_transaction(engine) as connection:
        at = MigrationContext.configure(connection, opts={"version_table": VERSION_TABLE}).get_current_revision()
        if at is not None and at == (head_revision() if revision == "head" else revision):
            return at  # nothing to apply: Alembic would read every script and run the environment to learn that
        config = _config(connection)
        if _predates_migrations(connection):
            command.stamp(config, FIRST_REVISION)
        command.upgrade(config, revision)
    return current_revision(engine)


def downgrade(engine: Engine, revision: str) -> str | None:
    """Undo revisions down to ``revision`` (``base``: everything); returns the revision afterwards."""
    with write_transaction(engine) as connection:
        command.downgrade(_config(connection), revision)
    return current_revision(engine)


def check(engine: Engine) -> None:
    """Raise SchemaError unless the database is at this code's revision."""
    head = head_revision()
    with engine.connect() as connection:
        predates = _predates_migrations(connection)
        current = MigrationContext.configure(connection, opts={"version_table": VERSION_TABLE}).get_current_revision()
    where = engine.url.render_as_string(hide_password=True)
    if current == head:
        return
    if current is None and not predates:
        raise SchemaError(f"the job database {where} has no job tables yet: run `{UPGRADE_COMMAND}` first")
    if current is None or current in revisions():
        at = current or f"{FIRST_REVISION} (made before migrations)"
        raise SchemaError(f"the job database {where} is at schema revision {at}, behind this mirserve's {head}: "
                          f"run `{UPGRADE_COMMAND}` first")
    raise SchemaError(f"the job database {where} is at schema revision {current}, which this mirserve does not "
                      f"know (its newest is {head}): a newer mirserve upgraded it; run that version")
