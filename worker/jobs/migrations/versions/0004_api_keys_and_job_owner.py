"""API keys, and the owner of every job.

- ``mirserve_api_keys``: one row per key (``mirserve keys create``): its id (the lookup part of the token),
  owner, role, the scrypt hash of its secret, expiry and revocation times;
- ``mirserve_jobs.owner`` (indexed): the owner of the key that submitted the job. Jobs made before it have
  none, and only admins see them.

Revision ID: 0004
Revises: 0003
"""
from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0004"
down_revision = "0003"
branch_labels = None
depends_on = None

UTC = sa.DateTime(timezone=True)  # as the other revisions declare times


def upgrade() -> None:
    op.create_table(
        "mirserve_api_keys",
        sa.Column("id", sa.String(32), primary_key=True),
        sa.Column("owner", sa.String(200), nullable=False),
        sa.Column("role", sa.String(16), nullable=False),
        sa.Column("secret_hash", sa.String(255), nullable=False),
        sa.Column("created_at", UTC, nullable=False),
        sa.Column("expires_at", UTC, nullable=True),
        sa.Column("revoked_at", UTC, nullable=True),
    )
    op.create_index("ix_mirserve_api_keys_owner", "mirserve_api_keys", ["owner"])
    with op.batch_alter_table("mirserve_jobs") as batch:
        batch.add_column(sa.Column("owner", sa.String(200), nullable=True))
        batch.create_index("ix_mirserve_jobs_owner", ["owner"])


def downgrade() -> None:
    with op.batch_alter_table("mirserve_jobs") as batch:
        batch.drop_index("ix_mirserve_jobs_owner")
        batch.drop_column("owner")
    op.drop_table("mirserve_api_keys")
