"""The replicated auth state (etcd's ``server/auth/store.go``): users, roles, permissions, the
enabled flag and the auth revision, changed only by applying log entries.

Contract. ``AuthStore.apply(request)`` is deterministic: the same entries in the same order
give the same state on every member (no clock, no randomness; passwords arrive already hashed,
see ``passwords``). Every successful change bumps ``revision`` by one; a failed one changes
nothing and returns etcd's error (``kvserver.auth.errors``). Checks and texts are etcd's:
enabling needs a ``root`` user holding the ``root`` role; with auth enabled the root user and
role cannot be deleted and root cannot lose the root role (``invalid auth management``);
granting the role ``root`` does not need the role to exist; the root role holds every
permission (``READWRITE ["", "\\0")``, what ``role get root`` shows).

Log entry (byte layout): msgpack ``[AUTH_ENTRY_FORMAT (= 65, "A"), 0, 0, [op, args...]]``, so
an auth entry starts with ``94 41`` (lease entries ``94 4c``, MVCC entries ``94 01``).
Ops (never renumber, only add): 1 enable, 2 disable, 3 user add ``[name, hash]``, 4 user
delete ``[name]``, 5 change password ``[name, hash]``, 6 grant role ``[user, role]``, 7 revoke
role ``[user, role]``, 8 role add ``[name]``, 9 role delete ``[name]``, 10 grant permission
``[role, perm_type, key, range_end]``, 11 revoke permission ``[role, key, range_end]``,
12 authenticate ``[name, token_sha256, checked_revision]`` (a simple token's digest, never the
token; refused if the state changed since the password was checked, etcd's optimistic check).
Auth requests are not de-duplicated (a retried ``user add`` answers "already exists").

Snapshot (byte layout): ``AUTH_FRAME_MAGIC | len (uint32 big-endian) | msgpack map``
``{"version": 1, "enabled", "revision", "users": [[name, hash, [roles]]], "roles": [[name,
[[perm_type, key, range_end]]]]}``; sorted, so equal states give equal bytes. A snapshot
without the frame (older, or a cluster that never used auth: ``is_empty``) restores the empty
state.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import msgpack

from kvserver.kvpb.errors import CodecError, SnapshotFormatError

from . import errors as E
from .passwords import is_valid_hash
from .perms import Permission, PermType, UserPerms

ROOT = "root"
ROOT_PERM = Permission(PermType.READWRITE, b"", b"\0")
AUTH_ENTRY_FORMAT = 65  # "A"
_ENTRY_PREFIX = b"\x94\x41"
AUTH_FRAME_MAGIC = b"RKVAUTH1"
_FRAME_HEADER_BYTES = len(AUTH_FRAME_MAGIC) + 4
SNAPSHOT_VERSION = 1
MAX_NAME_BYTES = 256  # bound names (etcd has none; we bound everything)


# --- requests (what a log entry holds) ---------------------------------------------------------


@dataclass(frozen=True, slots=True)
class AuthEnable:
    pass


@dataclass(frozen=True, slots=True)
class AuthDisable:
    pass


@dataclass(frozen=True, slots=True)
class UserAdd:
    name: str
    password_hash: bytes


@dataclass(frozen=True, slots=True)
class UserDelete:
    name: str


@dataclass(frozen=True, slots=True)
class UserChangePassword:
    name: str
    password_hash: bytes


@dataclass(frozen=True, slots=True)
class UserGrantRole:
    user: str
    role: str


@dataclass(frozen=True, slots=True)
class UserRevokeRole:
    name: str
    role: str


@dataclass(frozen=True, slots=True)
class RoleAdd:
    name: str


@dataclass(frozen=True, slots=True)
class RoleDelete:
    role: str


@dataclass(frozen=True, slots=True)
class RoleGrantPermission:
    name: str
    perm: Permission


@dataclass(frozen=True, slots=True)
class RoleRevokePermission:
    role: str
    key: bytes
    range_end: bytes


@dataclass(frozen=True, slots=True)
class Authenticate:
    name: str
    token_sha256: bytes
    checked_revision: int


_OPS: dict[type, int] = {
    AuthEnable: 1,
    AuthDisable: 2,
    UserAdd: 3,
    UserDelete: 4,
    UserChangePassword: 5,
    UserGrantRole: 6,
    UserRevokeRole: 7,
    RoleAdd: 8,
    RoleDelete: 9,
    RoleGrantPermission: 10,
    RoleRevokePermission: 11,
    Authenticate: 12,
}
_BY_OP = {op: cls for cls, op in _OPS.items()}


def encode_auth_entry(req: Any) -> bytes:
    op = _OPS.get(type(req))
    if op is None:
        raise CodecError(f"not an auth request: {type(req).__name__}")
    if type(req) is RoleGrantPermission:
        args: list = [req.name, int(req.perm.perm_type), req.perm.key, req.perm.range_end]
    else:
        args = [getattr(req, f) for f in req.__slots__]
    return msgpack.packb([AUTH_ENTRY_FORMAT, 0, 0, [op, *args]], use_bin_type=True)


def is_auth_entry(payload: bytes) -> bool:
    return payload[:2] == _ENTRY_PREFIX


_ARG_TYPES: dict[type, tuple[type, ...]] = {
    AuthEnable: (),
    AuthDisable: (),
    UserAdd: (str, bytes),
    UserDelete: (str,),
    UserChangePassword: (str, bytes),
    UserGrantRole: (str, str),
    UserRevokeRole: (str, str),
    RoleAdd: (str,),
    RoleDelete: (str,),
    RoleGrantPermission: (str, int, bytes, bytes),
    RoleRevokePermission: (str, bytes, bytes),
    Authenticate: (str, bytes, int),
}


def decode_auth_entry(data: bytes) -> Any:
    """The request of an ``encode_auth_entry`` entry; raises ``CodecError``."""
    try:
        plain = msgpack.unpackb(data, raw=False)
    except Exception as err:  # msgpack raises several types for garbage
        raise CodecError(f"auth entry is not msgpack: {err}") from err
    if (
        type(plain) is not list
        or len(plain) != 4
        or plain[0] != AUTH_ENTRY_FORMAT
        or type(plain[3]) is not list
        or not plain[3]
    ):
        raise CodecError("not a raftkv auth entry")
    op, *args = plain[3]
    cls = _BY_OP.get(op) if type(op) is int else None
    if cls is None:
        raise CodecError(f"unknown auth op {op!r}")
    types_ = _ARG_TYPES[cls]
    if len(args) != len(types_) or any(type(a) is not t for a, t in zip(args, types_, strict=True)):
        raise CodecError(f"malformed auth entry for {cls.__name__}")
    if cls is RoleGrantPermission:
        if args[1] not in (0, 1, 2):
            raise CodecError("unknown permission type")
        return RoleGrantPermission(args[0], Permission(PermType(args[1]), args[2], args[3]))
    return cls(*args)


# --- state --------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class User:
    name: str
    password_hash: bytes
    roles: tuple[str, ...] = ()  # sorted


@dataclass(frozen=True, slots=True)
class Role:
    name: str
    perms: tuple[Permission, ...] = ()  # sorted by key, as etcd keeps them


@dataclass(frozen=True, slots=True)
class AuthenticateResult:
    """Applied authenticate: the member's token table registers ``token_sha256``."""

    name: str
    token_sha256: bytes


@dataclass(frozen=True, slots=True)
class Changed:
    """Applied change; ``invalidate_user``: that user's tokens must be dropped (deleted, or
    password changed), ``disabled``: every token must be dropped."""

    invalidate_user: str | None = None
    disabled: bool = False


def _check_name(name: str, empty_error: type[E.AuthError]) -> None:
    if not name:
        raise empty_error()
    if len(name.encode("utf-8")) > MAX_NAME_BYTES:
        raise E.InvalidAuthMgmtError(f"raftkv: name longer than {MAX_NAME_BYTES} bytes")


@dataclass
class AuthStore:
    enabled: bool = False
    revision: int = 1
    users: dict[str, User] = field(default_factory=dict)
    roles: dict[str, Role] = field(default_factory=dict)
    _perm_cache: dict[str, UserPerms] = field(default_factory=dict)

    # --- reads ---------------------------------------------------------------------------------

    def is_empty(self) -> bool:
        return not self.enabled and not self.users and not self.roles and self.revision == 1

    def is_root(self, name: str) -> bool:
        user = self.users.get(name)
        return user is not None and ROOT in user.roles

    def user_perms(self, name: str) -> UserPerms | None:
        """Merged permissions of a user (None: no such user); cached until the next change."""
        cached = self._perm_cache.get(name)
        if cached is not None:
            return cached
        user = self.users.get(name)
        if user is None:
            return None
        if ROOT in user.roles:
            perms = UserPerms.of([ROOT_PERM])
        else:
            perms = UserPerms.of(
                p for r in user.roles if r in self.roles for p in self.roles[r].perms
            )
        self._perm_cache[name] = perms
        return perms

    def role_perms(self, name: str) -> tuple[Permission, ...]:
        role = self.roles.get(name)
        if role is None:
            raise E.RoleNotFoundError()
        return (ROOT_PERM,) if name == ROOT else role.perms

    def user_roles(self, name: str) -> tuple[str, ...]:
        user = self.users.get(name)
        if user is None:
            raise E.UserNotFoundError()
        return user.roles

    # --- apply ----------------------------------------------------------------------------------

    def apply(self, req: Any) -> tuple[Any, E.AuthError | None]:
        """(result, None) or (None, error); see the module docstring."""
        handler = getattr(self, "_apply_" + type(req).__name__, None)
        if handler is None:
            return None, E.InvalidAuthMgmtError(f"raftkv: unknown auth request {type(req)}")
        try:
            result = handler(req)
        except _NoChange as same:
            return same.result, None
        except E.AuthError as err:
            return None, err
        if not isinstance(result, AuthenticateResult):
            self.revision += 1
            self._perm_cache.clear()
        return result, None

    def apply_entry(self, data: bytes) -> tuple[Any, E.AuthError | None]:
        try:
            req = decode_auth_entry(data)
        except CodecError as err:
            return None, E.InvalidAuthMgmtError(f"raftkv: undecodable auth entry: {err}")
        return self.apply(req)

    def _apply_AuthEnable(self, req: AuthEnable) -> Changed:
        if self.enabled:
            raise _NoChange(Changed())
        root = self.users.get(ROOT)
        if root is None:
            raise E.RootUserNotExistError()
        if ROOT not in root.roles:
            raise E.RootRoleNotExistError()
        self.enabled = True
        return Changed()

    def _apply_AuthDisable(self, req: AuthDisable) -> Changed:
        self.enabled = False
        return Changed(disabled=True)

    def _apply_UserAdd(self, req: UserAdd) -> Changed:
        _check_name(req.name, E.UserEmptyError)
        if req.name in self.users:
            raise E.UserAlreadyExistError()
        if not is_valid_hash(req.password_hash):
            raise E.InvalidAuthMgmtError("raftkv: malformed password hash")
        self.users[req.name] = User(req.name, req.password_hash)
        return Changed()

    def _apply_UserDelete(self, req: UserDelete) -> Changed:
        if self.enabled and req.name == ROOT:
            raise E.InvalidAuthMgmtError()
        if req.name not in self.users:
            raise E.UserNotFoundError()
        del self.users[req.name]
        return Changed(invalidate_user=req.name)

    def _apply_UserChangePassword(self, req: UserChangePassword) -> Changed:
        user = self.users.get(req.name)
        if user is None:
            raise E.UserNotFoundError()
        if not is_valid_hash(req.password_hash):
            raise E.InvalidAuthMgmtError("raftkv: malformed password hash")
        self.users[req.name] = User(user.name, req.password_hash, user.roles)
        return Changed(invalidate_user=req.name)

    def _apply_UserGrantRole(self, req: UserGrantRole) -> Changed:
        user = self.users.get(req.user)
        if user is None:
            raise E.UserNotFoundError()
        if req.role != ROOT and req.role not in self.roles:
            raise E.RoleNotFoundError()
        if req.role in user.roles:  # etcd ignores a duplicate grant (and still bumps nothing)
            raise _NoChange(Changed())
        self.users[req.user] = User(
            user.name, user.password_hash, tuple(sorted((*user.roles, req.role)))
        )
        return Changed()

    def _apply_UserRevokeRole(self, req: UserRevokeRole) -> Changed:
        if self.enabled and req.name == ROOT and req.role == ROOT:
            raise E.InvalidAuthMgmtError()
        user = self.users.get(req.name)
        if user is None:
            raise E.UserNotFoundError()
        if req.role not in user.roles:
            raise E.RoleNotGrantedError()
        self.users[req.name] = User(
            user.name, user.password_hash, tuple(r for r in user.roles if r != req.role)
        )
        return Changed()

    def _apply_RoleAdd(self, req: RoleAdd) -> Changed:
        _check_name(req.name, E.RoleEmptyError)
        if req.name in self.roles:
            raise E.RoleAlreadyExistError()
        self.roles[req.name] = Role(req.name)
        return Changed()

    def _apply_RoleDelete(self, req: RoleDelete) -> Changed:
        if self.enabled and req.role == ROOT:
            raise E.InvalidAuthMgmtError()
        if req.role not in self.roles:
            raise E.RoleNotFoundError()
        del self.roles[req.role]
        for name, user in list(self.users.items()):
            if req.role in user.roles:
                self.users[name] = User(
                    name, user.password_hash, tuple(r for r in user.roles if r != req.role)
                )
        return Changed()

    def _apply_RoleGrantPermission(self, req: RoleGrantPermission) -> Changed:
        role = self.roles.get(req.name)
        if role is None:
            raise E.RoleNotFoundError()
        p = req.perm
        kept = [q for q in role.perms if (q.key, q.range_end) != (p.key, p.range_end)]
        kept.append(p)  # an existing (key, range_end) gets the new type, as etcd
        self.roles[req.name] = Role(
            role.name, tuple(sorted(kept, key=lambda q: (q.key, q.range_end)))
        )
        return Changed()

    def _apply_RoleRevokePermission(self, req: RoleRevokePermission) -> Changed:
        role = self.roles.get(req.role)
        if role is None:
            raise E.RoleNotFoundError()
        kept = tuple(q for q in role.perms if (q.key, q.range_end) != (req.key, req.range_end))
        if len(kept) == len(role.perms):
            raise E.PermissionNotGrantedError()
        self.roles[req.role] = Role(role.name, kept)
        return Changed()

    def _apply_Authenticate(self, req: Authenticate) -> AuthenticateResult:
        if not self.enabled:
            raise E.AuthNotEnabledError()
        if req.name not in self.users or req.checked_revision != self.revision:
            # Deleted, or changed (maybe its password) since the password was checked.
            raise E.AuthFailedError()
        return AuthenticateResult(req.name, req.token_sha256)

    # --- snapshot ---------------------------------------------------------------------------

    def snapshot(self) -> bytes:
        obj = {
            "version": SNAPSHOT_VERSION,
            "enabled": self.enabled,
            "revision": self.revision,
            "users": [
                [u.name, u.password_hash, list(u.roles)]
                for u in sorted(self.users.values(), key=lambda u: u.name)
            ],
            "roles": [
                [r.name, [[int(p.perm_type), p.key, p.range_end] for p in r.perms]]
                for r in sorted(self.roles.values(), key=lambda r: r.name)
            ],
        }
        return msgpack.packb(obj, use_bin_type=True)

    @classmethod
    def restore(cls, blob: bytes | None) -> AuthStore:
        """A store from ``snapshot()`` bytes (None: the empty state). Raises
        ``SnapshotFormatError`` on anything malformed."""
        if blob is None:
            return cls()
        try:
            obj = msgpack.unpackb(blob, raw=False)
            if type(obj) is not dict or obj.get("version") != SNAPSHOT_VERSION:
                raise ValueError("unknown auth snapshot version")
            store = cls(enabled=bool(obj["enabled"]), revision=int(obj["revision"]))
            for name, pw, roles in obj["users"]:
                if (
                    type(name) is not str
                    or type(pw) is not bytes
                    or any(type(r) is not str for r in roles)
                ):
                    raise ValueError("bad user row")
                store.users[name] = User(name, pw, tuple(roles))
            for name, perms in obj["roles"]:
                if type(name) is not str:
                    raise ValueError("bad role row")
                store.roles[name] = Role(
                    name, tuple(Permission(PermType(t), bytes(k), bytes(e)) for t, k, e in perms)
                )
        except (ValueError, TypeError, KeyError) as err:
            raise SnapshotFormatError(f"bad auth snapshot: {err}") from None
        except Exception as err:  # msgpack's own errors
            raise SnapshotFormatError(f"auth snapshot is not msgpack: {err}") from None
        return store


class _NoChange(E.AuthError):
    """Internal: the request succeeds without changing anything (no revision bump)."""

    def __init__(self, result: Any) -> None:
        super().__init__("")
        self.result = result


# --- snapshot frame ------------------------------------------------------------------------------


def frame_auth(blob: bytes) -> bytes:
    return AUTH_FRAME_MAGIC + len(blob).to_bytes(4, "big") + blob


def split_auth_frame(data: bytes | memoryview) -> tuple[bytes | None, memoryview]:
    """``(auth blob, rest)``; ``(None, data)`` for a snapshot without the frame."""
    view = memoryview(data)
    if view[: len(AUTH_FRAME_MAGIC)] != AUTH_FRAME_MAGIC:
        return None, view
    if len(view) < _FRAME_HEADER_BYTES:
        raise SnapshotFormatError("truncated auth frame")
    n = int.from_bytes(view[len(AUTH_FRAME_MAGIC) : _FRAME_HEADER_BYTES], "big")
    end = _FRAME_HEADER_BYTES + n
    if len(view) < end:
        raise SnapshotFormatError("truncated auth frame")
    return bytes(view[_FRAME_HEADER_BYTES:end]), view[end:]
