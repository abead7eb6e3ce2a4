"""Salted password hashes with ``hashlib.scrypt`` (standard library; etcd uses bcrypt).

A hash is ASCII bytes ``scrypt$<n>$<r>$<p>$<salt b64>$<digest b64>``: the parameters travel
with it, so members with different cost settings verify each other's hashes. Hashing happens
on the member that received the request, before it proposes: the raft log and snapshots carry
the hash, never the password. ``verify`` compares in constant time and, for a missing user
(``stored is None``), still spends one hash, so timing does not tell which names exist.
Passwords are never logged.

Hashes imported from etcd (``raftkv snapshot restore`` of an etcd snapshot: etcd keeps
bcrypt hashes, ``$2a$<cost>$...``) are verified as they are, with ``bcrypt``, so users keep
their passwords across the move; a password set or changed here is hashed with scrypt. An
empty hash (etcd's user added with ``--no-password``) never matches.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import secrets

import bcrypt

DEFAULT_N = 1 << 14  # 16 MiB of memory and ~50 ms per hash on a laptop core
DEFAULT_R = 8
DEFAULT_P = 1
SALT_BYTES = 16
DIGEST_BYTES = 32
_MAX_N = 1 << 20
_DUMMY_SALT = b"raftkv-no-such-user"
_BCRYPT_PREFIXES = (b"$2a$", b"$2b$", b"$2y$")


def _scrypt(password: str, salt: bytes, n: int, r: int, p: int) -> bytes:
    return hashlib.scrypt(
        password.encode("utf-8"),
        salt=salt,
        n=n,
        r=r,
        p=p,
        maxmem=256 * n * r + (1 << 20),
        dklen=DIGEST_BYTES,
    )


def hash_password(
    password: str, *, n: int = DEFAULT_N, r: int = DEFAULT_R, p: int = DEFAULT_P
) -> bytes:
    salt = secrets.token_bytes(SALT_BYTES)
    digest = _scrypt(password, salt, n, r, p)
    return b"$".join(
        [
            b"scrypt",
            str(n).encode(),
            str(r).encode(),
            str(p).encode(),
            base64.b64encode(salt),
            base64.b64encode(digest),
        ]
    )


def is_valid_hash(stored: bytes) -> bool:
    try:
        _parse(stored)
    except ValueError:
        return False
    return True


def _parse(stored: bytes) -> tuple[int, int, int, bytes, bytes]:
    parts = stored.split(b"$")
    if len(parts) != 6 or parts[0] != b"scrypt":
        raise ValueError("not a raftkv scrypt hash")
    n, r, p = (int(x) for x in parts[1:4])
    if not (2 <= n <= _MAX_N and n & (n - 1) == 0 and 1 <= r <= 32 and 1 <= p <= 16):
        raise ValueError("scrypt parameters out of range")
    return (
        n,
        r,
        p,
        base64.b64decode(parts[4], validate=True),
        base64.b64decode(parts[5], validate=True),
    )


def verify(password: str, stored: bytes | None, *, n: int = DEFAULT_N) -> bool:
    """Whether ``password`` matches ``stored`` (``None``: no such user, always False)."""
    if stored is None:
        _scrypt(password, _DUMMY_SALT, n, DEFAULT_R, DEFAULT_P)
        return False
    if stored.startswith(_BCRYPT_PREFIXES):
        try:
            return bcrypt.checkpw(password.encode("utf-8"), stored)
        except ValueError:  # a malformed bcrypt hash
            return False
    try:
        sn, r, p, salt, digest = _parse(stored)
    except ValueError:
        return False
    return hmac.compare_digest(_scrypt(password, salt, sn, r, p), digest)
