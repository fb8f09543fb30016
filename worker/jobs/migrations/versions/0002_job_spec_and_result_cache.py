"""One job spec column; the result cache's key and source.

- ``spec`` (JSON: places, engine options, cache) replaces the ``places`` and ``options`` columns: a job's
  spec is one value from submission to the engine process, and places are no longer capped at 2,000
  characters by a column;
- ``cache_key`` (indexed) names what a succeeded job's artifact is the result of (model, spec, engine version,
  plugins); ``cached_from`` is the job whose result a cached job reuses.

Rows are converted in both directions (a downgrade splits the spec again, dropping its ``cache`` flag).

Revision ID: 0002
Revises: 0001
"""
from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0002"
down_revision = "0001"
branch_labels = None
depends_on = None

BATCH = 500


def upgrade() -> None:
    with op.batch_alter_table("mirserve_jobs") as batch:
        batch.add_column(sa.Column("spec", sa.JSON, nullable=True))
        batch.add_column(sa.Column("cache_key", sa.String(64), nullable=True))
        batch.add_column(sa.Column("cached_from", sa.String(36), nullable=True))
        batch.create_index("ix_mirserve_jobs_cache_key", ["cache_key"])
    jobs = sa.table("mirserve_jobs", sa.column("id", sa.String), sa.column("places", sa.String),
                    sa.column("options", sa.JSON), sa.column("spec", sa.JSON))
    _convert(jobs, [jobs.c.places, jobs.c.options],
             lambda places, options: {"spec": {"places": places, "options": options or {}, "cache": True}})
    with op.batch_alter_table("mirserve_jobs") as batch:
        batch.alter_column("spec", existing_type=sa.JSON, nullable=False)
        batch.drop_column("places")
        batch.drop_column("options")


def downgrade() -> None:
    with op.batch_alter_table("mirserve_jobs") as batch:
        batch.add_column(sa.Column("places", sa.String(2000), nullable=True))
        batch.add_column(sa.Column("options", sa.JSON, nullable=True))
    jobs = sa.table("mirserve_jobs", sa.column("id", sa.String), sa.column("places", sa.String),
                    sa.column("options", sa.JSON), sa.column("spec", sa.JSON))
    _convert(jobs, [jobs.c.spec],
             lambda spec: {"places": str(spec["places"])[:2000], "options": spec.get("options") or {}})
    with op.batch_alter_table("mirserve_jobs") as batch:
        batch.alter_column("places", existing_type=sa.String(2000), nullable=False)
        batch.alter_column("options", existing_type=sa.JSON, nullable=False)
        batch.drop_index("ix_mirserve_jobs_cache_key")
        batch.drop_column("cached_from")
        batch.drop_column("cache_key")
        batch.drop_column("spec")


def _convert(jobs: sa.TableClause, columns: list, new_values) -> None:
    """Rewrite every row, ``BATCH`` at a time, in id order (the table may be large)."""
    connection = op.get_bind()
    last = ""
    while True:
        rows = connection.execute(sa.select(jobs.c.id, *columns).where(jobs.c.id > last)
                                  .order_by(jobs.c.id).limit(BATCH)).all()
        for row in rows:
            connection.execute(jobs.update().where(jobs.c.id == row[0]).values(**new_values(*row[1:])))
        if len(rows) < BATCH:
            return
        last = rows[-1][0]
