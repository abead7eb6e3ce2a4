"""etcd's auth errors (``api/v3rpc/rpctypes/error.go``): exact texts and gRPC codes.

The HTTP status follows from the code through ``HTTP_STATUS_BY_GRPC_CODE`` like every other
error: InvalidArgument 400, FailedPrecondition 412, PermissionDenied 403, Unauthenticated 401,
ResourceExhausted 429.
"""

from __future__ import annotations

from kvserver.kvpb.errors import EtcdError, GrpcCode


class AuthError(EtcdError):
    """Base of the auth errors; a failed auth request changed nothing."""


def _error(name: str, code: GrpcCode, text: str) -> type[AuthError]:
    return type(name, (AuthError,), {"grpc_code": code, "default_message": text, "__doc__": text})


_IA, _FP = GrpcCode.INVALID_ARGUMENT, GrpcCode.FAILED_PRECONDITION
RootUserNotExistError = _error("RootUserNotExistError", _FP, "etcdserver: root user does not exist")
RootRoleNotExistError = _error(
    "RootRoleNotExistError", _FP, "etcdserver: root user does not have root role"
)
UserAlreadyExistError = _error("UserAlreadyExistError", _FP, "etcdserver: user name already exists")
UserEmptyError = _error("UserEmptyError", _IA, "etcdserver: user name is empty")
UserNotFoundError = _error("UserNotFoundError", _FP, "etcdserver: user name not found")
RoleAlreadyExistError = _error("RoleAlreadyExistError", _FP, "etcdserver: role name already exists")
RoleNotFoundError = _error("RoleNotFoundError", _FP, "etcdserver: role name not found")
RoleEmptyError = _error("RoleEmptyError", _IA, "etcdserver: role name is empty")
AuthFailedError = _error(
    "AuthFailedError", _IA, "etcdserver: authentication failed, invalid user ID or password"
)
PermissionDeniedError = _error(
    "PermissionDeniedError", GrpcCode.PERMISSION_DENIED, "etcdserver: permission denied"
)
RoleNotGrantedError = _error(
    "RoleNotGrantedError", _FP, "etcdserver: role is not granted to the user"
)
PermissionNotGrantedError = _error(
    "PermissionNotGrantedError", _FP, "etcdserver: permission is not granted to the role"
)
AuthNotEnabledError = _error(
    "AuthNotEnabledError", _FP, "etcdserver: authentication is not enabled"
)
InvalidAuthTokenError = _error(
    "InvalidAuthTokenError", GrpcCode.UNAUTHENTICATED, "etcdserver: invalid auth token"
)
InvalidAuthMgmtError = _error("InvalidAuthMgmtError", _IA, "etcdserver: invalid auth management")
# etcd's auth.ErrPermissionNotGiven reaches the gateway untranslated (gRPC Unknown).
PermissionNotGivenError = _error(
    "PermissionNotGivenError", GrpcCode.UNKNOWN, "auth: permission not given"
)
# Not etcd's: our bound on failed authentications per client address (tokens.FailureLimiter).
TooManyAuthFailuresError = _error(
    "TooManyAuthFailuresError",
    GrpcCode.RESOURCE_EXHAUSTED,
    "etcdserver: too many requests (raftkv: too many failed authentications from this "
    "address; retry later)",
)

ERRORS: tuple[type[AuthError], ...] = (
    RootUserNotExistError,
    RootRoleNotExistError,
    UserAlreadyExistError,
    UserEmptyError,
    UserNotFoundError,
    RoleAlreadyExistError,
    RoleNotFoundError,
    RoleEmptyError,
    AuthFailedError,
    PermissionDeniedError,
    RoleNotGrantedError,
    PermissionNotGrantedError,
    AuthNotEnabledError,
    InvalidAuthTokenError,
    InvalidAuthMgmtError,
    PermissionNotGivenError,
    TooManyAuthFailuresError,
)
