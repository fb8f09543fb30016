"""The service's logs: one JSON object per line (python-json-logger), for the API, the worker and the reaper.

Every record has ``time``, ``level``, ``logger`` and ``message``; the job side adds what the record is about
as fields of its own (``job_id``, ``attempt``, ``pass``, ``status``, ``error_type``, ``reason``, ``field``),
so a log pipeline can find every line of one job, or every failure and why, without parsing sentences. The
access log (uvicorn's, at ``info``) gets ``client``, ``method``, ``path`` and ``status`` fields. huey's
per-message chatter is kept at ``warning`` unless the level is ``debug``.

``MIRSERVE_LOG_FORMAT=text`` gives plain lines instead (the same fields, as ``key=value``), for a terminal.
"""
from __future__ import annotations

import logging
import sys
from typing import Any

#: Attributes every LogRecord has; anything else on a record is a field someone added with ``extra=``.
_STANDARD = set(vars(logging.makeLogRecord({}))) | {"message", "asctime", "taskName"}
#: Loggers too chatty at info: huey logs every message it hands to a consumer thread.
QUIET = ("huey", "huey.consumer", "huey.storage")


class AccessFields(logging.Filter):
    """uvicorn's access records carry (client, method, path, http version, status) as arguments: make them
    fields."""

    def filter(self, record: logging.LogRecord) -> bool:
        args = record.args
        if record.name == "uvicorn.access" and isinstance(args, tuple) and len(args) == 5:
            record.client, record.method, record.path, _, record.status = args
        return True


def _fields(record: logging.LogRecord) -> dict[str, Any]:
    return {k: v for k, v in vars(record).items() if k not in _STANDARD and not k.startswith("_")}


class TextFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        line = super().format(record)
        extra = " ".join(f"{k}={v}" for k, v in _fields(record).items())
        return f"{line} {extra}" if extra else line


def formatter(kind: str) -> logging.Formatter:
    if kind == "text":
        return TextFormatter("%(asctime)s %(name)s %(levelname)s %(message)s")
    from pythonjsonlogger.json import JsonFormatter

    return JsonFormatter("%(asctime)s %(levelname)s %(name)s %(message)s", timestamp=False,
                         rename_fields={"asctime": "time", "levelname": "level", "name": "logger"},
                         datefmt="%Y-%m-%dT%H:%M:%S%z", json_ensure_ascii=False)


class _Handler(logging.StreamHandler):
    """Writes to the given stream, or to whatever ``sys.stderr`` is when a record comes (it may be replaced)."""

    def __init__(self, stream=None):
        super().__init__(stream)
        self._fixed = stream

    @property
    def stream(self):
        return self._fixed if self._fixed is not None else sys.stderr

    @stream.setter
    def stream(self, value):
        self._fixed = value


def configure_logging(level: str = "info", kind: str = "json", stream=None) -> None:
    """Our handler on the root logger (replacing one this function installed before, and nothing else), in the
    chosen format; uvicorn's and huey's loggers go through it."""
    handler = _Handler(stream)
    handler.setFormatter(formatter(kind))
    handler.addFilter(AccessFields())
    root = logging.getLogger()
    for old in [h for h in root.handlers if isinstance(h, _Handler)]:
        root.removeHandler(old)
    root.addHandler(handler)
    root.setLevel(level.upper())
    for name in ("uvicorn", "uvicorn.error", "uvicorn.access"):  # whatever an earlier server set up
        logger = logging.getLogger(name)
        logger.handlers.clear()
        logger.setLevel(logging.NOTSET)
        logger.propagate, logger.disabled = True, False
    for name in QUIET:
        logging.getLogger(name).setLevel(logging.DEBUG if level.lower() == "debug" else logging.WARNING)
