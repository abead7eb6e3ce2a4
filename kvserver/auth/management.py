"""etcd's Auth service calls (``etcdserverpb.Auth``), whatever dialect carries them: who may
make each call, the checks in order, what is proposed, what is answered.

The JSON gateway (``kvserver.api.http.auth``) and gRPC (``kvserver.api.grpc.auth``) decode a
request, call one function here with the ``AuthService`` (None: the member has none, every
call is Unimplemented) and the caller (``user``: the name the token or client certificate
resolved to; None when auth is disabled or the call carried no credentials), and render the
result in their own shapes. Errors are ``EtcdError``s with etcd's codes and texts.

Who may call (etcd's ``needAdminPermission``): with auth enabled every call needs the root
role except ``authenticate``, ``status``, ``user_get`` of oneself and ``role_get`` of a role
one holds; a call that needs root and carries no credentials is ``etcdserver: user name is
empty``. With auth disabled anyone may call anything (``auth enable`` is how it starts).

Passwords (``new_password``): users without a password (``options.no_password``) and
pre-hashed passwords are refused as InvalidArgument ``raftkv: ...`` (we hash with scrypt
ourselves and keep no password-less users), and a password is at most
``MAX_PASSWORD_BYTES``. Hashing happens here, off the event loop, before proposing.
"""

from __future__ import annotations

from typing import Any

from kvserver.kvpb.service_errors import GrpcCode, ServiceError

from . import errors as E
from .perms import Permission
from .store import (
    AuthDisable,
    AuthEnable,
    RoleAdd,
    RoleDelete,
    RoleGrantPermission,
    RoleRevokePermission,
    UserAdd,
    UserChangePassword,
    UserDelete,
    UserGrantRole,
    UserRevokeRole,
)

MAX_PASSWORD_BYTES = 1024
MSG_NO_AUTH_SERVICE = "raftkv: this member has no auth service"


def invalid(message: str) -> ServiceError:
    """InvalidArgument ``raftkv: <message>``: input etcd would take but we do not."""
    return ServiceError(GrpcCode.INVALID_ARGUMENT, "raftkv: " + message)


def present(auth: Any) -> Any:
    """``auth`` itself, or Unimplemented when the member has no auth service."""
    if auth is None:
        raise ServiceError(GrpcCode.UNIMPLEMENTED, MSG_NO_AUTH_SERVICE)
    return auth


def admin(auth: Any, user: str | None) -> Any:
    """``auth`` when ``user`` may manage auth (root, or auth disabled); else etcd's error."""
    auth = present(auth)
    auth.check_admin(user)
    if auth.enabled and user is None:
        raise E.UserEmptyError()
    return auth


def new_password(password: str, *, hashed: bool = False, no_password: bool = False) -> str:
    """``password`` if we take it (see the module docstring); the request's other ways of
    giving one (``hashed``, ``no_password``) are refused."""
    if hashed:
        raise invalid("pre-hashed passwords are not supported; send password")
    if no_password:
        raise invalid("users without a password are not supported")
    if len(password.encode("utf-8", "surrogatepass")) > MAX_PASSWORD_BYTES:
        raise invalid(f"password longer than {MAX_PASSWORD_BYTES} bytes")
    return password


async def _change(auth: Any, user: str | None, req: Any) -> None:
    await admin(auth, user).propose(req)


async def enable(auth: Any, user: str | None) -> None:
    await _change(auth, user, AuthEnable())


async def disable(auth: Any, user: str | None) -> None:
    await _change(auth, user, AuthDisable())


def status(auth: Any) -> tuple[bool, int]:
    """(enabled, auth revision); anyone may ask."""
    auth = present(auth)
    return bool(auth.enabled), int(auth.store.revision)


async def authenticate(auth: Any, name: str, password: str, address: str) -> str:
    """A new token for ``name``; ``address`` is the client's, for the failure limiter."""
    return str(await present(auth).authenticate(name, new_password(password), address))


async def user_add(auth: Any, user: str | None, name: str, password: str) -> None:
    """``password`` has been through ``new_password``."""
    auth = admin(auth, user)
    if not name:
        raise E.UserEmptyError()
    await auth.propose(UserAdd(name, await auth.hash_password(password)))


def user_get(auth: Any, user: str | None, name: str) -> tuple[str, ...]:
    """``name``'s roles; a user may read their own without root."""
    auth = present(auth)
    if user != name:
        admin(auth, user)
    return tuple(auth.user_roles(name))


def user_list(auth: Any, user: str | None) -> list[str]:
    return list(admin(auth, user).users())


async def user_delete(auth: Any, user: str | None, name: str) -> None:
    await _change(auth, user, UserDelete(name))


async def user_change_password(auth: Any, user: str | None, name: str, password: str) -> None:
    """``password`` has been through ``new_password``."""
    auth = admin(auth, user)
    auth.user_roles(name)  # user name not found: before spending a hash
    await auth.propose(UserChangePassword(name, await auth.hash_password(password)))


async def user_grant_role(auth: Any, user: str | None, name: str, role: str) -> None:
    await _change(auth, user, UserGrantRole(name, role))


async def user_revoke_role(auth: Any, user: str | None, name: str, role: str) -> None:
    await _change(auth, user, UserRevokeRole(name, role))


async def role_add(auth: Any, user: str | None, name: str) -> None:
    await _change(auth, user, RoleAdd(name))


def role_get(auth: Any, user: str | None, role: str) -> tuple[Permission, ...]:
    """``role``'s permissions; a user may read those of a role they hold without root."""
    auth = present(auth)
    holder = auth.store.users.get(user) if user is not None else None
    if holder is None or role not in holder.roles:
        admin(auth, user)
    return tuple(auth.role_perms(role))


def role_list(auth: Any, user: str | None) -> list[str]:
    return list(admin(auth, user).roles())


async def role_delete(auth: Any, user: str | None, role: str) -> None:
    await _change(auth, user, RoleDelete(role))


async def role_grant_permission(
    auth: Any, user: str | None, role: str, perm: Permission | None
) -> None:
    """``perm`` None: the request carried none (etcd's ``permission not given``)."""
    auth = admin(auth, user)
    if perm is None:
        raise E.PermissionNotGivenError()
    await auth.propose(RoleGrantPermission(role, perm))


async def role_revoke_permission(
    auth: Any, user: str | None, role: str, key: bytes, range_end: bytes
) -> None:
    await _change(auth, user, RoleRevokePermission(role, key, range_end))
