"""API keys: made, listed and revoked by ``mirserve keys``, checked by the API on every request.

A key is ``msk_<id>_<secret>``. The id is the row's primary key, so checking a key reads one row and computes
one hash, however many keys there are. Only the scrypt hash of the secret is stored (hashlib's, from
OpenSSL); the secret is printed once, when the key is made, and cannot be shown again.

scrypt is deliberately slow, and the API checks a key on every request, so a process remembers the SHA-256
of each secret it has verified and compares later requests with that: the scrypt runs once per key and
process. The row (revoked? expired?) is still read on every request, so a revocation holds at once
everywhere.
"""
from __future__ import annotations

import base64
import enum
import hashlib
import hmac
import re
import secrets
import threading
from dataclasses import dataclass
from datetime import datetime

from sqlalchemy import insert, select, update

from worker.jobs.db import read_transaction, write_transaction
from worker.jobs.store import JobStore, api_keys_table

PREFIX = "msk"
ID_BYTES = 8          # 16 hex characters
SECRET_BYTES = 32
#: scrypt cost: 16 MiB and some 50 ms per hash on one core (RFC 7914's interactive figures).
SCRYPT_N, SCRYPT_R, SCRYPT_P = 1 << 14, 8, 1
OWNER_PATTERN = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._@+-]{0,199}$")
TOKEN_PATTERN = re.compile(rf"^{PREFIX}_([0-9a-f]{{{2 * ID_BYTES}}})_([A-Za-z0-9_-]{{20,100}})$")


class Role(str, enum.Enum):
    USER = "user"      # sees and acts on its own jobs only
    ADMIN = "admin"    # sees every job

    def __str__(self) -> str:
        return self.value


class KeyRefused(ValueError):
    """A key cannot be made or revoked as asked; the message says why (the CLI prints it)."""


@dataclass(frozen=True)
class ApiKey:
    id: str
    owner: str
    role: Role
    created_at: datetime
    expires_at: datetime | None
    revoked_at: datetime | None

    @classmethod
    def from_row(cls, row) -> "ApiKey":
        return cls(id=row.id, owner=row.owner, role=Role(row.role), created_at=row.created_at,
                   expires_at=row.expires_at, revoked_at=row.revoked_at)

    def refusal(self, now: datetime) -> str | None:
        """Why this key is not accepted at ``now`` (a sentence), or None when it is."""
        if self.revoked_at is not None:
            return "the API key was revoked"
        if self.expires_at is not None and self.expires_at <= now:
            return "the API key has expired"
        return None


def hash_secret(secret: str) -> str:
    salt = secrets.token_bytes(16)
    digest = hashlib.scrypt(secret.encode(), salt=salt, n=SCRYPT_N, r=SCRYPT_R, p=SCRYPT_P, dklen=32)
    encode = lambda b: base64.b64encode(b).decode()  # noqa: E731
    return f"scrypt${SCRYPT_N}${SCRYPT_R}${SCRYPT_P}${encode(salt)}${encode(digest)}"


def secret_matches(secret: str, stored: str) -> bool:
    try:
        kind, n, r, p, salt, digest = stored.split("$")
        expected = base64.b64decode(digest)
        found = hashlib.scrypt(secret.encode(), salt=base64.b64decode(salt), n=int(n), r=int(r), p=int(p),
                               dklen=len(expected))
    except ValueError:
        return False
    return kind == "scrypt" and hmac.compare_digest(found, expected)


class KeyStore:
    """The API key table, on the job store's database."""

    def __init__(self, store: JobStore):
        self.store = store
        self._verified: dict[str, bytes] = {}   # key id -> SHA-256 of the secret that passed scrypt here
        self._lock = threading.Lock()

    def create(self, owner: str, role: Role | str = Role.USER, expires_at: datetime | None = None) -> tuple[ApiKey, str]:
        """A new key for ``owner``; returns it and its token (the only time the token exists in clear)."""
        if not OWNER_PATTERN.match(owner):
            raise KeyRefused(f"the owner name {owner!r} is not allowed: use up to 200 letters, digits and . _ @ + -, "
                            "starting with a letter or digit")
        try:
            role = Role(role)
        except ValueError:
            raise KeyRefused(f"the role must be 'user' or 'admin', not {role!r}") from None
        now = self.store.clock()
        if expires_at is not None and expires_at <= now:
            raise KeyRefused(f"the expiry {expires_at.isoformat()} is not in the future")
        key_id, secret = secrets.token_hex(ID_BYTES), secrets.token_urlsafe(SECRET_BYTES)
        values = dict(id=key_id, owner=owner, role=role.value, secret_hash=hash_secret(secret), created_at=now,
                      expires_at=expires_at, revoked_at=None)
        with write_transaction(self.store.engine) as conn:
            conn.execute(insert(api_keys_table).values(**values))
        return ApiKey(key_id, owner, role, now, expires_at, None), f"{PREFIX}_{key_id}_{secret}"

    def list(self, owner: str | None = None) -> list[ApiKey]:
        query = select(api_keys_table).order_by(api_keys_table.c.created_at, api_keys_table.c.id)
        if owner is not None:
            query = query.where(api_keys_table.c.owner == owner)
        with read_transaction(self.store.engine) as conn:
            return [ApiKey.from_row(r) for r in conn.execute(query)]

    def revoke(self, key_id: str) -> ApiKey:
        """Revoke a key at once (a key already revoked keeps its first revocation time)."""
        c = api_keys_table.c
        with write_transaction(self.store.engine) as conn:
            conn.execute(update(api_keys_table).where(c.id == key_id, c.revoked_at.is_(None))
                         .values(revoked_at=self.store.clock()))
            row = conn.execute(select(api_keys_table).where(c.id == key_id)).first()
        if row is None:
            raise KeyRefused(f"there is no API key {key_id!r} (`mirserve keys list` shows them)")
        return ApiKey.from_row(row)

    def authenticate(self, token: str) -> ApiKey | str:
        """The key a bearer token stands for, or why it is refused (a sentence)."""
        match = TOKEN_PATTERN.match(token)
        if match is None:
            return f"the token is not a mirserve API key ({PREFIX}_<id>_<secret>)"
        key_id, secret = match.groups()
        with read_transaction(self.store.engine) as conn:
            row = conn.execute(select(api_keys_table).where(api_keys_table.c.id == key_id)).first()
        if row is None or not self._secret_ok(key_id, secret, row.secret_hash):
            return "the API key is not valid"
        key = ApiKey.from_row(row)
        return key.refusal(self.store.clock()) or key

    def _secret_ok(self, key_id: str, secret: str, stored: str) -> bool:
        fingerprint = hashlib.sha256(secret.encode()).digest()
        with self._lock:
            known = self._verified.get(key_id)
        if known is not None:
            return hmac.compare_digest(known, fingerprint)
        if not secret_matches(secret, stored):
            return False
        with self._lock:
            self._verified[key_id] = fingerprint
        return True


__all__ = ["ApiKey", "KeyRefused", "KeyStore", "Role"]
