"""The job tables' migrations, on SQLite and on the local PostgreSQL server: every revision up and down with
rows in the table, the newest equal to what the code declares, the first equal to the table the service made
before it had migrations, and processes that refuse a database that is not at their revision.
"""
from __future__ import annotations

import secrets
from datetime import datetime, timezone

import pytest
import sqlalchemy as sa
from alembic.autogenerate import compare_metadata
from alembic.runtime.migration import MigrationContext

from app.cli import main
from tests.service.conftest import POSTGRES_URL, server_unavailable
from tests.service.server import Server
from worker.jobs import schema
from worker.jobs.store import JobStore, metadata

NOW = datetime(2025, 1, 1, tzinfo=timezone.utc)


def pre_migration_metadata() -> sa.MetaData:
    """The job tables exactly as the service created them (``create_all``) before it had migrations."""
    from worker.jobs.db import UTCDateTime

    old = sa.MetaData()
    sa.Table("mirserve_jobs", old,
             sa.Column("id", sa.String(36), primary_key=True),
             sa.Column("state", sa.String(16), nullable=False, index=True),
             sa.Column("created_at", UTCDateTime, nullable=False, index=True),
             sa.Column("updated_at", UTCDateTime, nullable=False),
             sa.Column("enqueued_at", UTCDateTime, nullable=True),
             sa.Column("started_at", UTCDateTime, nullable=True),
             sa.Column("finished_at", UTCDateTime, nullable=True, index=True),
             sa.Column("attempt", sa.Integer, nullable=False, default=0),
             sa.Column("max_attempts", sa.Integer, nullable=False),
             sa.Column("lease_token", sa.String(32), nullable=True),
             sa.Column("lease_expires_at", UTCDateTime, nullable=True, index=True),
             sa.Column("worker_id", sa.String(200), nullable=True),
             sa.Column("child_pid", sa.Integer, nullable=True),
             sa.Column("cancel_requested", sa.Boolean, nullable=False, default=False),
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
             sa.Column("summary", sa.JSON, nullable=True))
    sa.Table("mirserve_workers", old,
             sa.Column("id", sa.String(200), primary_key=True),
             sa.Column("hostname", sa.String(255), nullable=False),
             sa.Column("pid", sa.Integer, nullable=False),
             sa.Column("concurrency", sa.Integer, nullable=False),
             sa.Column("running", sa.Integer, nullable=False, default=0),
             sa.Column("started_at", UTCDateTime, nullable=False),
             sa.Column("heartbeat_at", UTCDateTime, nullable=False, index=True))
    return old


@pytest.fixture(params=["sqlite", "postgres"])
def empty_database(request, tmp_path):
    """A store on an empty database: a new SQLite file, or a new schema on the local PostgreSQL server."""
    if request.param == "sqlite":
        store = JobStore(f"sqlite:///{tmp_path / 'mirserve.db'}")
        yield store
        store.dispose()
        return
    name = f"mirserve_migrate_{secrets.token_hex(4)}"
    admin = sa.create_engine(POSTGRES_URL, connect_args={"connect_timeout": 5})
    try:
        with admin.begin() as conn:
            conn.execute(sa.text(f"CREATE SCHEMA {name}"))
    except Exception as error:  # noqa: BLE001 - any connection failure is "unreachable"
        admin.dispose()
        server_unavailable(f"PostgreSQL at {POSTGRES_URL}", error)
    separator = "&" if "?" in POSTGRES_URL else "?"
    store = JobStore(f"{POSTGRES_URL}{separator}options=-csearch_path%3D{name}")
    yield store
    store.dispose()
    with admin.begin() as conn:
        conn.execute(sa.text(f"DROP SCHEMA {name} CASCADE"))
    admin.dispose()


def differences(engine: sa.Engine, declared: sa.MetaData) -> list:
    """What Alembic's autogenerate would change to make the database match ``declared``."""
    with engine.connect() as conn:
        context = MigrationContext.configure(conn, opts={"compare_type": True})
        found = compare_metadata(context, declared)
    return [d for d in found if not (d[0] == "remove_table" and d[1].name == schema.VERSION_TABLE)]


def tables(engine: sa.Engine) -> set[str]:
    return set(sa.inspect(engine).get_table_names()) - {schema.VERSION_TABLE}


def old_job_row(job_id: str) -> dict:
    return dict(id=job_id, state="succeeded", created_at=NOW, updated_at=NOW, attempt=1, max_attempts=3,
                cancel_requested=False, input_filename="det.onnx", input_bytes=10, input_sha256="0" * 64,
                places="arm/fp16/nhwc,arm/fp32/nchw", options={"opt_level": 1, "input_shapes": {"x": [1, 3]}})


def test_every_revision_goes_up_and_down_keeping_the_rows(empty_database):
    store, engine = empty_database, empty_database.engine
    revisions = schema.revisions()
    assert revisions[0] == schema.FIRST_REVISION and revisions[-1] == schema.head_revision()
    assert schema.upgrade(engine, revisions[0]) == revisions[0]
    assert differences(engine, pre_migration_metadata()) == []  # the first revision is the old table
    old_jobs = pre_migration_metadata().tables["mirserve_jobs"]
    with engine.begin() as conn:
        conn.execute(old_jobs.insert().values(**old_job_row("a")))
        conn.execute(old_jobs.insert().values(**old_job_row("b"), idempotency_key="k"))
    for revision in revisions[1:]:
        assert schema.upgrade(engine, revision) == revision
    assert differences(engine, metadata) == []  # the newest revision is what the code declares
    job = store.get("b")
    assert (job.spec.places, dict(job.spec.options), job.spec.cache) == (
        "arm/fp16/nhwc,arm/fp32/nchw", {"opt_level": 1, "input_shapes": {"x": [1, 3]}}, True)
    assert job.idempotency_key == "k" and job.cache_key is None and job.cached_from is None
    for revision in reversed(revisions[:-1]):
        assert schema.downgrade(engine, revision) == revision
    with engine.connect() as conn:
        rows = conn.execute(sa.select(old_jobs.c.id, old_jobs.c.places, old_jobs.c.options)
                            .order_by(old_jobs.c.id)).all()
    assert [tuple(r) for r in rows] == [(i, old_job_row(i)["places"], old_job_row(i)["options"]) for i in "ab"]
    assert schema.downgrade(engine, "base") is None
    assert tables(engine) == set()


def test_a_database_made_before_migrations_is_taken_as_the_first_revision(empty_database):
    store, engine = empty_database, empty_database.engine
    pre_migration_metadata().create_all(engine)
    with engine.begin() as conn:
        conn.execute(pre_migration_metadata().tables["mirserve_jobs"].insert().values(**old_job_row("old")))
    with pytest.raises(schema.SchemaError, match=r"0001 \(made before migrations\), behind .*mirserve db upgrade"):
        schema.check(engine)
    assert schema.upgrade(engine) == schema.head_revision()
    schema.check(engine)
    assert store.get("old").spec.places == "arm/fp16/nhwc,arm/fp32/nchw"


def test_check_says_what_to_run(empty_database):
    engine = empty_database.engine
    with pytest.raises(schema.SchemaError, match="has no job tables yet: run `mirserve db upgrade` first"):
        schema.check(engine)
    schema.upgrade(engine, schema.FIRST_REVISION)
    with pytest.raises(schema.SchemaError, match=f"at schema revision 0001, behind this mirserve's "
                                                 f"{schema.head_revision()}: run `mirserve db upgrade` first"):
        schema.check(engine)
    schema.upgrade(engine)
    schema.check(engine)
    with engine.begin() as conn:
        conn.execute(sa.text(f"UPDATE {schema.VERSION_TABLE} SET version_num = '9999'"))
    with pytest.raises(schema.SchemaError, match="revision 9999, which this mirserve does not know"):
        schema.check(engine)


def test_db_commands_upgrade_and_report_and_api_and_worker_refuse_a_database_behind(monkeypatch, tmp_path, capsys):
    monkeypatch.setenv("MIRSERVE_DATA_DIR", str(tmp_path))
    assert main(["db", "upgrade", "0001"]) == 0
    assert "revision 0001" in capsys.readouterr().out
    assert main(["db", "current"]) == 0
    assert f"run `mirserve db upgrade` to reach {schema.head_revision()}" in capsys.readouterr().out
    for command in ("worker", "api"):
        with pytest.raises(SystemExit) as refused:
            main([command])
        assert "behind this mirserve's" in str(refused.value) and "run `mirserve db upgrade`" in str(refused.value)
    assert main(["db", "upgrade"]) == 0
    assert main(["db", "current"]) == 0
    assert "(up to date)" in capsys.readouterr().out
    assert main(["db", "downgrade", "base"]) == 0
    assert "base (no tables)" in capsys.readouterr().out


def test_serve_upgrades_its_own_sqlite_database(tmp_path):
    data = tmp_path / "data"
    data.mkdir()
    engine = JobStore(f"sqlite:///{data / 'mirserve.db'}").engine
    schema.upgrade(engine, schema.FIRST_REVISION)
    with Server(data):
        assert schema.current_revision(engine) == schema.head_revision()
    engine.dispose()
