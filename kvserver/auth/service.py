"""``AuthService``: one member's view of auth — the replicated ``AuthStore``, this member's
token table and failure limiter, and the checks every request goes through.

Writes (user/role changes, enable/disable, token assignment) are proposed through raft with
the ``propose`` callable (``RaftKV`` passes ``node.propose``; tests pass a local apply) and
answered with the outcome this member computed when applying, like every other write.
Passwords are hashed here, off the event loop, before proposing. ``authenticate`` first waits
for a read barrier (so a password just changed on another member counts), checks the password
against the local replicated state (off the loop; bounded per client address by the
``FailureLimiter``), then proposes the token's digest with the auth revision it checked
(``store.Authenticate``): a change in between refuses it, and it is retried a few times.

Enforcement (``user_for`` then the ``check_*`` functions), identical on every member because
it reads only replicated state and the token table every member fills from the log: with auth
disabled everything passes and no header is needed; enabled, a request without a token is
``etcdserver: user name is empty`` (what etcd answers a request with no credentials), an
unknown or expired token ``etcdserver: invalid auth token``, a key outside the user's
permissions ``etcdserver: permission denied``, an admin call by a non-root user too.
Requests are checked when this member receives them; like etcd's simple-token path we do not
re-check a write at apply time, so a write checked just before a revoke may still apply.

``on_change(callback)`` registers a function called after every applied change and restore
(watch streams re-check their watchers there, and a revoked permission cancels them).
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any

from kvserver.kvpb.kv import (
    CompactionRequest,
    DeleteRangeRequest,
    PutRequest,
    RangeRequest,
    TxnRequest,
)

from . import errors as E
from . import passwords
from .perms import Permission
from .store import (
    ROOT,
    Authenticate,
    AuthenticateResult,
    AuthStore,
    Changed,
    encode_auth_entry,
    frame_auth,
)
from .tokens import FailureLimiter, TokenTable, new_token, token_digest

AUTHENTICATE_ATTEMPTS = 3


class AuthService:
    def __init__(
        self,
        *,
        propose: Callable[[bytes], Awaitable[Any]] | None = None,
        read_barrier: Callable[[], Awaitable[object]] | None = None,
        tokens: TokenTable | None = None,
        limiter: FailureLimiter | None = None,
        hash_n: int = passwords.DEFAULT_N,
    ) -> None:
        self.store = AuthStore()
        self.tokens = tokens if tokens is not None else TokenTable()
        self.limiter = limiter if limiter is not None else FailureLimiter()
        self.hash_n = hash_n
        self._propose = propose
        self._read_barrier = read_barrier
        self._listeners: list[Callable[[], None]] = []

    # --- replicated side (called by the state machine) -----------------------------------

    def apply_entry(self, payload: bytes) -> Any:
        """Apply an auth log entry; returns the result or the error (as the node expects)."""
        result, error = self.store.apply_entry(payload)
        if error is not None:
            return error
        if isinstance(result, AuthenticateResult):
            self.tokens.assign(result.token_sha256, result.name)
        elif isinstance(result, Changed):
            if result.disabled:
                self.tokens.clear()
            if result.invalidate_user is not None:
                self.tokens.invalidate_user(result.invalidate_user)
            self._notify()
        return result

    def snapshot_frame(self) -> bytes:
        """The auth frame for a snapshot; empty when auth was never used (older layout)."""
        return b"" if self.store.is_empty() else frame_auth(self.store.snapshot())

    def restore(self, blob: bytes | None) -> None:
        self.store = AuthStore.restore(blob)
        self.tokens.clear()
        self._notify()

    def on_change(self, callback: Callable[[], None]) -> Callable[[], None]:
        """Register ``callback``; returns the function that unregisters it."""
        self._listeners.append(callback)
        return lambda: self._listeners.remove(callback) if callback in self._listeners else None

    def _notify(self) -> None:
        for callback in list(self._listeners):
            callback()

    # --- proposing ----------------------------------------------------------------------------

    async def _write(self, req: Any) -> Any:
        if self._propose is None:
            raise E.InvalidAuthMgmtError("raftkv: this member cannot change auth state")
        return await self._propose(encode_auth_entry(req))

    async def _hash(self, password: str) -> bytes:
        return await asyncio.to_thread(passwords.hash_password, password, n=self.hash_n)

    async def propose(self, req: Any) -> Any:
        """Propose a prepared request (``store`` dataclasses; passwords already hashed)."""
        return await self._write(req)

    async def hash_password(self, password: str) -> bytes:
        return await self._hash(password)

    async def authenticate(self, name: str, password: str, address: str) -> str:
        """A new simple token for ``name``; raises etcd's errors (see the module docstring)."""
        if not self.store.enabled:
            raise E.AuthNotEnabledError()
        if not self.limiter.allowed(address):
            raise E.TooManyAuthFailuresError()
        for _ in range(AUTHENTICATE_ATTEMPTS):
            if self._read_barrier is not None:
                await self._read_barrier()
            revision = self.store.revision
            user = self.store.users.get(name)
            stored = user.password_hash if user is not None else None
            ok = await asyncio.to_thread(passwords.verify, password, stored, n=self.hash_n)
            if not ok:
                self.limiter.failed(address)
                raise E.AuthFailedError()
            token = new_token()
            try:
                await self._write(Authenticate(name, token_digest(token), revision))
            except E.AuthFailedError:
                continue  # the state changed since the check: check again
            return token
        raise E.AuthFailedError()

    # --- enforcement ----------------------------------------------------------------------------

    @property
    def enabled(self) -> bool:
        return self.store.enabled

    def user_for(self, authorization: str | None) -> str | None:
        """The user a request acts as: None when auth is disabled; raises when enabled and
        the token is missing, unknown or expired."""
        if not self.store.enabled:
            return None
        if not authorization:
            raise E.UserEmptyError()
        token = authorization.strip()
        if token[:7].lower() == "bearer ":
            token = token[7:].strip()
        user = self.tokens.user_of(token)
        if user is None or user not in self.store.users:
            raise E.InvalidAuthTokenError()
        return user

    def _perms(self, user: str):  # type: ignore[no-untyped-def]
        perms = self.store.user_perms(user)
        if perms is None:
            raise E.PermissionDeniedError()
        return perms

    def is_root(self, user: str | None) -> bool:
        return user is None or self.store.is_root(user)

    def check_admin(self, user: str | None) -> None:
        if user is not None and self.store.enabled and not self.store.is_root(user):
            raise E.PermissionDeniedError()

    def can_read(self, user: str | None, key: bytes, range_end: bytes = b"") -> bool:
        if user is None or not self.store.enabled:
            return True
        perms = self.store.user_perms(user)
        return perms is not None and perms.can_read(key, range_end)

    def check_read(self, user: str | None, key: bytes, range_end: bytes = b"") -> None:
        if not self.can_read(user, key, range_end):
            raise E.PermissionDeniedError()

    def check_write(self, user: str | None, key: bytes, range_end: bytes = b"") -> None:
        if user is None or not self.store.enabled:
            return
        if not self._perms(user).can_write(key, range_end):
            raise E.PermissionDeniedError()

    def check_request(self, user: str | None, req: Any) -> None:
        """etcd's checks for a KV request (``checkTxnReqsPermission`` for a txn: every
        compare needs read, every op its own permission, nested txns too)."""
        if user is None or not self.store.enabled:
            return
        kind = type(req)
        if kind is RangeRequest:
            self.check_read(user, req.key, req.range_end)
        elif kind is PutRequest:
            self.check_write(user, req.key)
            if req.prev_kv:
                self.check_read(user, req.key)
        elif kind is DeleteRangeRequest:
            self.check_write(user, req.key, req.range_end)
            if req.prev_kv:
                self.check_read(user, req.key, req.range_end)
        elif kind is TxnRequest:
            for c in req.compare:
                self.check_read(user, c.key, c.range_end)
            for op in (*req.success, *req.failure):
                inner = (
                    op.request_range or op.request_put or op.request_delete_range or op.request_txn
                )
                if inner is not None:
                    self.check_request(user, inner)
        elif kind is CompactionRequest:
            pass  # etcd: any authenticated user may compact
        else:
            raise E.PermissionDeniedError()

    # --- reads of the replicated state (management API) --------------------------------------

    def role_perms(self, name: str) -> tuple[Permission, ...]:
        return self.store.role_perms(name)

    def user_roles(self, name: str) -> tuple[str, ...]:
        return self.store.user_roles(name)

    def users(self) -> list[str]:
        return sorted(self.store.users)

    def roles(self) -> list[str]:
        return sorted(self.store.roles)


__all__ = ["ROOT", "AuthService"]
