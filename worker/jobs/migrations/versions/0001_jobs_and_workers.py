"""The job and worker tables as the service created them before it had migrations.

A database made by that version (``create_all``, no version table) is this revision: ``worker.jobs.schema``
stamps it so before upgrading it.

Revision ID: 0001
Revises:
"""
from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0001"
down_revision = None
branch_labels = None
depends_on = None

UTC = sa.DateTime(timezone=True)


def upgrade() -> None:
    op.create_table(
        "mirserve_jobs",
        sa.Column("id", sa.String(36), primary_key=True),
        sa.Column("state", sa.String(16), nullable=False, index=True),
        sa.Column("created_at", UTC, nullable=False, index=True),
        sa.Column("updated_at", UTC, nullable=False),
        sa.Column("enqueued_at", UTC, nullable=True),
        sa.Column("started_at", UTC, nullable=True),
        sa.Column("finished_at", UTC, nullable=True, index=True),
        sa.Column("attempt", sa.Integer, nullable=False),
        sa.Column("max_attempts", sa.Integer, nullable=False),
        sa.Column("lease_token", sa.String(32), nullable=True),
        sa.Column("lease_expires_at", UTC, nullable=True, index=True),
        sa.Column("worker_id", sa.String(200), nullable=True),
        sa.Column("child_pid", sa.Integer, nullable=True),
        sa.Column("cancel_requested", sa.Boolean, nullable=False),
        sa.Column("progress_pass", sa.String(200), nullable=True),
        sa.Column("progress_index", sa.Integer, nullable=True),
        sa.Column("progress_total", sa.Integer, nullable=True),
        sa.Column("input_filename", sa.String(255), nullable=False),
        sa.Column("input_bytes", sa.BigInteger, nullable=False),
        sa.Column("input_sha256", sa.String(64), nullable=False),
        sa.Column("places", sa.String(2000), nullable=False),
        sa.Column("options", sa.JSON, nullable=False),
        sa.Column("idempotency_key", sa.String(255), nullable=True, unique=True),
        sa.Column("request_fingerprint", sa.String(64), nullable=True),
        sa.Column("artifact_attempt", sa.Integer, nullable=True),
        sa.Column("artifact_bytes", sa.BigInteger, nullable=True),
        sa.Column("artifact_sha256", sa.String(64), nullable=True),
        sa.Column("error_type", sa.String(100), nullable=True),
        sa.Column("error_message", sa.Text, nullable=True),
        sa.Column("error_field", sa.String(200), nullable=True),
        sa.Column("retry_reason", sa.Text, nullable=True),
        sa.Column("summary", sa.JSON, nullable=True),
    )
    op.create_table(
        "mirserve_workers",
        sa.Column("id", sa.String(200), primary_key=True),
        sa.Column("hostname", sa.String(255), nullable=False),
        sa.Column("pid", sa.Integer, nullable=False),
        sa.Column("concurrency", sa.Integer, nullable=False),
        sa.Column("running", sa.Integer, nullable=False),
        sa.Column("started_at", UTC, nullable=False),
        sa.Column("heartbeat_at", UTC, nullable=False, index=True),
    )


def downgrade() -> None:
    op.drop_table("mirserve_workers")
    op.drop_table("mirserve_jobs")
