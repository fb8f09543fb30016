"""The ``mirserve`` program: the engine's commands (``optimize``, ``passes``, ``targets``) plus the service's.

- ``mirserve serve``: the API and one embedded worker, in one process tree: the README's single command.
  The worker is a child process (a crashed or killed worker is restarted; it dies with the API).
- ``mirserve api`` / ``mirserve worker``: the two halves apart, to scale workers out (``mirserve worker`` is
  ``python -m worker.jobs``).
- ``mirserve db upgrade|downgrade|current``: the job tables' schema (``api`` and ``worker`` refuse a database
  that is not at their revision; ``serve`` upgrades its SQLite database itself).
- ``mirserve keys create|list|revoke``: the API keys clients send as ``Authorization: Bearer``.
- ``mirserve openapi``: print or write the OpenAPI document.

The engine's parser is extended here because the engine never imports the service.
"""
from __future__ import annotations

import argparse
import re
import sys
import tempfile
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Sequence

from worker.engine.api import add_plugin_argument, build_parser, run_cli

# worker.jobs is imported where a command needs it: its store brings SQLAlchemy and alembic (about 0.4 s), which
# the client commands (submit, jobs, ...) and the engine's own (optimize, passes) never use.


def main(argv: Sequence[str] | None = None) -> int:
    from app.client.cli import add_remote_commands

    parser, commands = build_parser()
    add_service_commands(commands)
    add_remote_commands(commands)
    return run_cli(argv, parser)


def add_service_commands(commands) -> None:
    for name, func, text in (("serve", run_serve, "run the API and one embedded worker (the usual way)"),
                             ("api", run_api, "run only the HTTP API"),
                             ("worker", run_worker, "run only a worker")):
        cmd = commands.add_parser(name, help=text, description=f"{text[0].upper()}{text[1:]}; settings come "
                                  "from MIRSERVE_* environment variables (see the README).")
        if name == "worker":
            from worker.jobs import add_worker_arguments

            add_worker_arguments(cmd)
        else:
            cmd.add_argument("--data-dir", help="overrides MIRSERVE_DATA_DIR")
            cmd.add_argument("--host", help="overrides MIRSERVE_HOST")
            cmd.add_argument("--port", type=int, help="overrides MIRSERVE_PORT")
        add_plugin_argument(cmd)
        cmd.set_defaults(func=func)
    cmd = commands.add_parser("db", help="create, upgrade or inspect the job database's schema",
                              description="Create, upgrade or inspect the job tables (MIRSERVE_DATABASE_URL, or "
                              "SQLite in the data directory). Run `mirserve db upgrade` after installing a new "
                              "version, before starting its APIs and workers.")
    cmd.add_argument("--data-dir", help="overrides MIRSERVE_DATA_DIR")
    actions = cmd.add_subparsers(dest="action", metavar="ACTION", required=True)
    upgrade = actions.add_parser("upgrade", help="create the tables or apply every newer revision")
    upgrade.add_argument("revision", nargs="?", default="head", help="stop at this revision (default: the newest)")
    downgrade = actions.add_parser("downgrade", help="undo revisions down to REVISION ('base': all of them)")
    downgrade.add_argument("revision")
    actions.add_parser("current", help="print the database's revision and this version's")
    cmd.set_defaults(func=run_db)
    add_keys_command(commands)
    cmd = commands.add_parser("openapi", help="print the service's OpenAPI document")
    cmd.add_argument("-o", "--output", help="write it to this file instead")
    cmd.set_defaults(func=run_openapi)


def add_keys_command(commands) -> None:
    cmd = commands.add_parser("keys", help="make, list or revoke the service's API keys",
                              description="API keys for the service (MIRSERVE_AUTH=keys, the default): clients "
                              "send one as 'Authorization: Bearer <key>'. A user key sees only its owner's jobs; "
                              "an admin key sees every job. Keys live in the job database (MIRSERVE_DATABASE_URL, "
                              "or SQLite in the data directory).")
    cmd.add_argument("--data-dir", help="overrides MIRSERVE_DATA_DIR")
    actions = cmd.add_subparsers(dest="action", metavar="ACTION", required=True)
    create = actions.add_parser("create", help="make a key and print it (once: only its hash is kept)")
    create.add_argument("--owner", required=True, help="whose jobs the key's requests make and see")
    create.add_argument("--role", choices=("user", "admin"), default="user", help="default: %(default)s")
    create.add_argument("--expires", metavar="WHEN", help="when the key stops working: a duration (30d, 12h, "
                        "90m) or an ISO 8601 time (2027-01-31, 2027-01-31T12:00:00+00:00); default: never")
    listing = actions.add_parser("list", help="every key: id, owner, role, created, expires, revoked")
    listing.add_argument("--owner", help="only this owner's keys")
    revoke = actions.add_parser("revoke", help="make a key stop working at once")
    revoke.add_argument("key_id", metavar="ID", help="the key's id (the part after msk_; `keys list` shows it)")
    cmd.set_defaults(func=run_keys)


def run_worker(args: argparse.Namespace) -> int:
    from worker.jobs import run_worker

    return run_worker(args)


def run_keys(args: argparse.Namespace) -> int:
    from worker.jobs import JobSettings, JobStore, KeyRefused, KeyStore, SchemaError, load_settings

    settings = load_settings(JobSettings, {"MIRSERVE_DATA_DIR": args.data_dir})
    store = JobStore(settings.effective_database_url)
    try:
        if settings.effective_database_url.startswith("sqlite"):  # as `serve` does with its own database
            store.upgrade_schema()
        store.check_schema()
        keys = KeyStore(store)
        if args.action == "create":
            key, token = keys.create(args.owner, args.role, _expiry(args.expires))
            print(token)
            expires = key.expires_at.isoformat(timespec="seconds") if key.expires_at else "never"
            print(f"made {key.role} key {key.id} for {key.owner} (expires: {expires}); this is the only time the "
                  "key is shown: give it to its owner now", file=sys.stderr)
        elif args.action == "list":
            print(f"{'id':<16}  {'owner':<24} {'role':<5}  {'created':<20} {'expires':<20} revoked")
            for key in keys.list(args.owner):
                print(f"{key.id:<16}  {key.owner:<24} {key.role.value:<5}  {_when(key.created_at):<20} "
                      f"{_when(key.expires_at):<20} {_when(key.revoked_at)}")
        else:
            key = keys.revoke(args.key_id)
            print(f"key {key.id} of {key.owner} is revoked (since {_when(key.revoked_at)})")
    except (SchemaError, KeyRefused) as error:
        raise SystemExit(f"mirserve: error: {error}") from None
    finally:
        store.dispose()
    return 0


def _expiry(text: str | None) -> datetime | None:
    """``--expires``: a duration from now (``30d``, ``12h``, ``90m``) or an ISO 8601 time (UTC if no zone)."""
    if text is None:
        return None
    duration = re.fullmatch(r"\s*(\d+)\s*([dhm])\s*", text)
    if duration:
        unit = {"d": "days", "h": "hours", "m": "minutes"}[duration[2]]
        return datetime.now(timezone.utc) + timedelta(**{unit: int(duration[1])})
    try:
        moment = datetime.fromisoformat(text.strip())
    except ValueError:
        raise SystemExit(f"mirserve: error: --expires {text!r} is neither a duration (30d, 12h, 90m) nor an ISO "
                         "8601 time (2027-01-31T12:00:00+00:00)") from None
    return moment if moment.tzinfo else moment.replace(tzinfo=timezone.utc)


def _when(moment: datetime | None) -> str:
    return moment.strftime("%Y-%m-%d %H:%M:%SZ") if moment else "-"


def _settings(args: argparse.Namespace):
    """The API's settings from the environment and the command's overrides (exported for the worker too)."""
    from app.settings import Settings

    from app.auth import InsecureBind, check_exposure
    from worker.jobs import configure_logging, load_settings

    settings = load_settings(Settings, {"MIRSERVE_DATA_DIR": args.data_dir, "MIRSERVE_HOST": args.host,
                                        "MIRSERVE_PORT": args.port})
    try:
        check_exposure(settings)
    except InsecureBind as error:
        raise SystemExit(f"mirserve: error: {error}") from None
    configure_logging(settings.log_level, settings.log_format)
    return settings


def run_api(args: argparse.Namespace) -> int:
    return _serve_api(_settings(args))


def _serve_api(settings) -> int:
    import uvicorn

    from app.main import create_app

    from app.auth import InsecureBind
    from worker.jobs import SchemaError

    try:
        app = create_app(settings)
    except (SchemaError, InsecureBind) as error:
        raise SystemExit(f"mirserve: error: {error}") from None
    # log_config=None: uvicorn's records (the access log at info among them) go through our JSON handler.
    uvicorn.run(app, host=settings.host, port=settings.port, log_level=settings.log_level, log_config=None,
                access_log=True)
    return 0


#: How long the embedded worker may take to stop beyond its grace period for running jobs.
WORKER_STOP_MARGIN_SECONDS = 10.0


def run_serve(args: argparse.Namespace) -> int:
    from worker.jobs import WorkerSupervisor

    settings = _settings(args)  # bad settings stop here, before anything starts
    if settings.effective_database_url.startswith("sqlite"):  # its own database: keep it at this version
        _with_store(settings, lambda store: store.upgrade_schema())
    supervisor = WorkerSupervisor(stop_seconds=settings.shutdown_grace_seconds + WORKER_STOP_MARGIN_SECONDS)
    supervisor.start()
    try:
        return _serve_api(settings)
    finally:
        supervisor.stop()


def run_db(args: argparse.Namespace) -> int:
    from worker.jobs import JobSettings, load_settings

    settings = load_settings(JobSettings, {"MIRSERVE_DATA_DIR": args.data_dir})
    if args.action == "upgrade":
        revision = _with_store(settings, lambda store: store.upgrade_schema(args.revision))
        print(f"the job database is at revision {revision}")
    elif args.action == "downgrade":
        revision = _with_store(settings, lambda store: store.downgrade_schema(args.revision))
        print(f"the job database is at revision {revision or 'base (no tables)'}")
    else:
        current, head = _with_store(settings, lambda store: store.schema_revision())
        state = "up to date" if current == head else f"run `mirserve db upgrade` to reach {head}"
        print(f"the job database is at revision {current or 'none'}; this mirserve's is {head} ({state})")
    return 0


def _with_store(settings, action):
    from worker.jobs import JobStore

    store = JobStore(settings.effective_database_url)
    try:
        return action(store)
    finally:
        store.dispose()


def run_openapi(args: argparse.Namespace) -> int:
    from app.main import create_app
    from app.openapi import render
    from app.settings import Settings

    with tempfile.TemporaryDirectory() as data_dir:  # the document does not depend on the data
        settings = Settings(data_dir=Path(data_dir), redis_url=None, database_url=None)
        _with_store(settings, lambda store: store.upgrade_schema())
        app = create_app(settings)
        text = render(app)
        app.state.services.close()
    if args.output:
        Path(args.output).write_text(text, encoding="utf-8")
    else:
        sys.stdout.write(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
