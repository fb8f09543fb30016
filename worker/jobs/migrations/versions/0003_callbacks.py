"""The outbox of job-ended notifications: one row per job submitted with a ``callback_url``.

Revision ID: 0003
Revises: 0002
"""
from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0003"
down_revision = "0002"
branch_labels = None
depends_on = None

UTC = sa.DateTime(timezone=True)  # as the other revisions declare times


def upgrade() -> None:
    op.create_table(
        "mirserve_callbacks",
        sa.Column("job_id", sa.String(36), sa.ForeignKey("mirserve_jobs.id", ondelete="CASCADE"), primary_key=True),
        sa.Column("url", sa.String(2048), nullable=False),
        sa.Column("state", sa.String(16), nullable=False),
        sa.Column("attempts", sa.Integer, nullable=False),
        sa.Column("next_at", UTC, nullable=False),
        sa.Column("delivered_at", UTC, nullable=True),
        sa.Column("last_error", sa.Text, nullable=True),
    )
    op.create_index("ix_mirserve_callbacks_state", "mirserve_callbacks", ["state"])
    op.create_index("ix_mirserve_callbacks_next_at", "mirserve_callbacks", ["next_at"])


def downgrade() -> None:
    op.drop_table("mirserve_callbacks")
