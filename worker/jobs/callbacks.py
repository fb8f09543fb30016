"""Notifications: a job submitted with a ``callback_url`` gets one signed JSON POST when it ends.

The delivery is an outbox: the API writes a pending row beside the job when it accepts it, and the workers'
notifier thread delivers the rows whose job has ended, however it ended (published, failed, canceled while
queued by the API, failed by the reaper): no code that ends a job has to remember to notify. A delivery is
claimed with one conditional update (so one worker sends it), sent with a short timeout on a thread of its
own (a slow receiver never holds up a job), and retried with exponential backoff until it gets a 2xx answer
or the attempts run out (the row then says why). Redirects are not followed.

Only hosts in MIRSERVE_CALLBACK_ALLOW may be called back (the allow list is what keeps a submission from
making the service call arbitrary addresses). Each POST is signed with HMAC-SHA256 under the deployment's
MIRSERVE_CALLBACK_SECRET: ``X-Mirserve-Signature: t=<unix time>,v1=<hex of HMAC(secret, "<t>.<body>")>``; a
receiver recomputes it over the raw body and rejects old timestamps (``verify_signature`` does both).
"""
from __future__ import annotations

import hashlib
import hmac
import json
import logging
import threading
import time
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any, Iterable
from urllib.parse import urlsplit

from sqlalchemy import and_, delete, select, update

from worker.jobs.db import read_transaction, utcnow, write_transaction
from worker.jobs.store import TERMINAL_STATES, Job, JobStore, callbacks_table, jobs_table

log = logging.getLogger("mirserve.callbacks")

SIGNATURE_HEADER = "X-Mirserve-Signature"
MAX_URL = 2048  # the url column's size
#: Delivery tries and the waits between them: 5 s, 10 s, 20 s ... about an hour in all.
MAX_ATTEMPTS = 10
FIRST_WAIT_SECONDS = 5.0
#: How long a claimed delivery is someone's before another worker may try it.
CLAIM_SECONDS = 60.0
TIMEOUT_SECONDS = 10.0

class CallbackRefused(ValueError):
    """The URL may not be called back (bad form, or a host the deployment does not allow)."""


def check_callback_url(url: str, allowed_hosts: Iterable[str]) -> str:
    """The URL, if it may be called back; a user-facing refusal otherwise."""
    allowed = {h.strip().lower() for h in allowed_hosts if h.strip()}
    if len(url) > MAX_URL:
        raise CallbackRefused(f"callback_url is longer than {MAX_URL} characters")
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise CallbackRefused(f"callback_url {url!r} is not an http(s) URL")
    if parts.username or parts.password:
        raise CallbackRefused("callback_url must not carry credentials; the POST is signed instead")
    if not allowed:
        raise CallbackRefused("this service calls back no host (its MIRSERVE_CALLBACK_ALLOW is empty)")
    host = parts.hostname.lower()
    with_port = f"{host}:{parts.port}" if parts.port else host
    if host not in allowed and with_port not in allowed:
        raise CallbackRefused(f"callback_url host {host!r} is not one this service calls back "
                              f"(MIRSERVE_CALLBACK_ALLOW: {', '.join(sorted(allowed))})")
    return url


def sign(secret: str, body: bytes, timestamp: int | None = None) -> str:
    """The signature header value for ``body``."""
    moment = int(time.time()) if timestamp is None else timestamp
    digest = hmac.new(secret.encode(), f"{moment}.".encode() + body, hashlib.sha256).hexdigest()
    return f"t={moment},v1={digest}"


def verify_signature(secret: str, body: bytes, header: str, tolerance_seconds: float = 300) -> bool:
    """What a receiver does: the signature is ours and the timestamp recent."""
    try:
        fields = dict(part.split("=", 1) for part in header.split(","))
        moment = int(fields["t"])
    except (ValueError, KeyError):
        return False
    if abs(time.time() - moment) > tolerance_seconds:
        return False
    expected = sign(secret, body, moment).split("v1=", 1)[1]
    return hmac.compare_digest(expected, fields.get("v1", ""))


def payload(job: Job, attempt: int) -> dict[str, Any]:
    """What the receiver learns: the job's outcome and where to fetch the rest (paths of the API)."""
    base = f"/jobs/{job.id}"
    body: dict[str, Any] = {"event": "job.finished", "delivery_attempt": attempt,
                            "job": {"id": job.id, "status": job.state.value, "input_filename": job.input_filename,
                                    "finished_at": job.finished_at.isoformat() if job.finished_at else None,
                                    "links": {"self": base}}}
    if job.error_type:
        body["job"]["error"] = {"type": job.error_type, "message": job.error_message, "field": job.error_field}
    if job.artifact_sha256:
        body["job"]["artifact"] = {"sha256": job.artifact_sha256, "bytes": job.artifact_bytes,
                                   "url": f"{base}/artifact"}
        body["job"]["links"].update(report=f"{base}/report", artifact=f"{base}/artifact")
    return body


@dataclass(frozen=True)
class Delivery:
    job: Job
    url: str
    attempt: int


class CallbackStore:
    """The outbox rows, on the job tables' database."""

    def __init__(self, store: JobStore):
        self.store = store

    def add(self, job_id: str, url: str) -> None:
        with write_transaction(self.store.engine) as conn:
            conn.execute(callbacks_table.insert().values(job_id=job_id, url=url, state="pending", attempts=0,
                                                         next_at=utcnow()))

    def get(self, job_id: str) -> dict[str, Any] | None:
        with read_transaction(self.store.engine) as conn:
            row = conn.execute(select(callbacks_table).where(callbacks_table.c.job_id == job_id)).first()
        return dict(row._mapping) if row is not None else None

    def claim_due(self, limit: int = 20) -> list[Delivery]:
        """Pending deliveries of ended jobs that are due, each claimed for CLAIM_SECONDS by this caller."""
        now = utcnow()
        due = (select(callbacks_table.c.job_id)
               .join(jobs_table, jobs_table.c.id == callbacks_table.c.job_id)
               .where(and_(callbacks_table.c.state == "pending", callbacks_table.c.next_at <= now,
                           jobs_table.c.state.in_([s.value for s in TERMINAL_STATES])))
               .limit(limit))
        claimed = []
        with read_transaction(self.store.engine) as conn:
            candidates = conn.execute(due).all()
        for (job_id,) in candidates:
            with write_transaction(self.store.engine) as conn:
                won = conn.execute(update(callbacks_table)  # the first to move next_at on wins
                                   .where(and_(callbacks_table.c.job_id == job_id, callbacks_table.c.next_at <= now,
                                               callbacks_table.c.state == "pending"))
                                   .values(next_at=now + timedelta(seconds=CLAIM_SECONDS),
                                           attempts=callbacks_table.c.attempts + 1)).rowcount
            if won:
                row, job = self.get(job_id), self.store.get(job_id)
                if row is not None and job is not None:
                    claimed.append(Delivery(job, row["url"], row["attempts"]))
        return claimed

    def delivered(self, job_id: str) -> None:
        self._set(job_id, state="delivered", delivered_at=utcnow(), last_error=None)

    def attempt_failed(self, delivery: Delivery, error: str) -> bool:
        """Schedule the next try with backoff; returns False when this was the last."""
        if delivery.attempt >= MAX_ATTEMPTS:
            self._set(delivery.job.id, state="failed", last_error=error)
            return False
        wait = FIRST_WAIT_SECONDS * 2 ** (delivery.attempt - 1)
        self._set(delivery.job.id, next_at=utcnow() + timedelta(seconds=wait), last_error=error)
        return True

    def purge_orphans(self) -> int:
        """Rows whose job is gone (databases that do not cascade deletes, such as SQLite by default)."""
        with write_transaction(self.store.engine) as conn:
            return conn.execute(delete(callbacks_table).where(
                ~callbacks_table.c.job_id.in_(select(jobs_table.c.id)))).rowcount

    def _set(self, job_id: str, **values: Any) -> None:
        with write_transaction(self.store.engine) as conn:
            conn.execute(update(callbacks_table).where(callbacks_table.c.job_id == job_id).values(**values))


class Notifier:
    """The worker's notifier thread: delivers due callbacks, each POST on a short-lived thread of its own."""

    def __init__(self, store: JobStore, secret: str, interval: float = 1.0):
        import httpx

        self.callbacks = CallbackStore(store)
        self.secret = secret
        self.interval = interval
        self._http = httpx.Client(timeout=TIMEOUT_SECONDS, follow_redirects=False)
        self._stopping = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="notifier", daemon=True)
        self._sending: set[threading.Thread] = set()

    def start(self) -> None:
        self._thread.start()

    def stop(self, timeout: float = 5.0) -> None:
        self._stopping.set()
        if self._thread.ident is not None:  # started
            self._thread.join(timeout)
        for sender in list(self._sending):
            sender.join(max(0.0, timeout))
        self._http.close()

    def _loop(self) -> None:
        rounds = 0
        while not self._stopping.wait(self.interval):
            try:
                for delivery in self.callbacks.claim_due():
                    sender = threading.Thread(target=self.send, args=(delivery,), name="callback", daemon=True)
                    self._sending.add(sender)
                    sender.start()
                rounds += 1
                if rounds % 600 == 0:
                    self.callbacks.purge_orphans()
            except Exception:  # noqa: BLE001 - a failed round must not end the loop
                log.exception("notifier round failed")
            self._sending = {t for t in self._sending if t.is_alive()}

    def send(self, delivery: Delivery) -> bool:
        """POST one delivery; record the outcome. Returns whether the receiver took it."""
        import httpx

        body = json.dumps(payload(delivery.job, delivery.attempt), separators=(",", ":")).encode()
        fields = {"job_id": delivery.job.id, "attempt": delivery.attempt, "url": delivery.url}
        try:
            response = self._http.post(delivery.url, content=body, headers={
                "Content-Type": "application/json", SIGNATURE_HEADER: sign(self.secret, body),
                "User-Agent": "mirserve-callback"})
            error = None if 200 <= response.status_code < 300 else f"HTTP {response.status_code}"
        except httpx.HTTPError as failure:
            error = f"{type(failure).__name__}: {failure}"[:500]
        if error is None:
            self.callbacks.delivered(delivery.job.id)
            log.info("callback delivered", extra=fields)
            return True
        again = self.callbacks.attempt_failed(delivery, error)
        log.warning("callback not delivered" + ("; will retry" if again else "; giving up"),
                    extra={**fields, "reason": error})
        return False
