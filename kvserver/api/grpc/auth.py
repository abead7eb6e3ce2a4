"""etcd's Auth service over gRPC (``etcdserverpb.Auth``): every RPC, AuthEnable to
RoleRevokePermission.

Each call is: the caller (``Calls.token_user``: the user of the ``token`` metadata, else the
verified client certificate's common name, else None; an unknown or expired token is
``etcdserver: invalid auth token``), the request's fields, one call of
``kvserver.auth.management`` (the same calls, checks, order and texts as the JSON gateway's
``/v3/auth/...``), the answer with this member's header. With auth enabled everything needs
root except Authenticate, AuthStatus, UserGet of oneself and RoleGet of a role one holds.

Field mapping as etcd's: AuthUserGrantRole names the user ``user``, AuthUserRevokeRole
``name``; AuthRoleGet/Delete/RevokePermission name the role ``role``, RoleAdd and
RoleGrantPermission ``name``. UserAdd/UserChangePassword with ``options.no_password`` or
``hashedPassword`` are refused InvalidArgument (``raftkv: ...``); RoleGrantPermission
without ``perm`` is etcd's ``auth: permission not given``, with a permType outside
READ/WRITE/READWRITE ``raftkv: unknown permission type N``.

Authenticate's failure limiter counts per client host (the connection's peer address without
its port, as the gateway counts per remote address).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any, TypeAlias

from kvserver.auth import management as M
from kvserver.auth.perms import Permission, PermType
from kvserver.etcdpb import auth_pb2, rpc_pb2

from .calls import Calls, service_handler
from .convert import bad_enum
from .rpc import Method, RpcContext

Ctx: TypeAlias = RpcContext
Body = Callable[[Any, Ctx, str | None], Awaitable[Any]]


def perm_to_pb(p: Permission) -> auth_pb2.Permission:
    return auth_pb2.Permission(permType=p.perm_type.name, key=p.key, range_end=p.range_end)


def perm_from_pb(m: auth_pb2.Permission) -> Permission:
    if m.permType not in (0, 1, 2):
        raise bad_enum("permission type", m.permType)
    return Permission(PermType(m.permType), m.key, m.range_end)


class AuthServicer:
    def __init__(self, service: Any, calls: Calls):
        self.service = service
        self.calls = calls

    @property
    def auth(self) -> Any:
        return self.calls.auth

    def header(self) -> rpc_pb2.ResponseHeader:
        st = self.service.status()
        return rpc_pb2.ResponseHeader(
            cluster_id=st.cluster_id,
            member_id=st.member_id,
            revision=st.revision,
            raft_term=st.raft_term,
        )

    def _unary(self, body: Body) -> Callable[[Any, Ctx], Awaitable[Any]]:
        async def call(request: Any, context: Ctx) -> Any:
            return await body(request, context, self.calls.token_user(context))

        return self.calls.unary(call)

    # --- the calls ------------------------------------------------------------------------------

    async def _auth_enable(
        self, req: rpc_pb2.AuthEnableRequest, ctx: Ctx, user: str | None
    ) -> rpc_pb2.AuthEnableResponse:
        await M.enable(self.auth, user)
        return rpc_pb2.AuthEnableResponse(header=self.header())

    async def _auth_disable(
        self, req: rpc_pb2.AuthDisableRequest, ctx: Ctx, user: str | None
    ) -> rpc_pb2.AuthDisableResponse:
        await M.disable(self.auth, user)
        return rpc_pb2.AuthDisableResponse(header=self.header())

    async def _auth_status(
        self, req: rpc_pb2.AuthStatusRequest, ctx: Ctx, user: str | None
    ) -> rpc_pb2.AuthStatusResponse:
        enabled, revision = M.status(self.auth)
        return rpc_pb2.AuthStatusResponse(
            header=self.header(), enabled=enabled, authRevision=revision
        )

    async def _authenticate(
        self, req: rpc_pb2.AuthenticateRequest, ctx: Ctx, user: str | None
    ) -> rpc_pb2.AuthenticateResponse:
        host = self.calls.caller(ctx).address.rpartition(":")[0] or "unknown"
        token = await M.authenticate(self.auth, req.name, req.password, host)
        return rpc_pb2.AuthenticateResponse(header=self.header(), token=token)

    async def _user_add(
        self, req: rpc_pb2.AuthUserAddRequest, ctx: Ctx, user: str | None
    ) -> rpc_pb2.AuthUserAddResponse:
        hashed, no_password = bool(req.hashedPassword), req.options.no_password
        password = M.new_password(req.password, hashed=hashed, no_password=no_password)
        await M.user_add(self.auth, user, req.name, password)
        return rpc_pb2.AuthUserAddResponse(header=self.header())

    async def _user_get(
        self, req: rpc_pb2.AuthUserGetRequest, ctx: Ctx, user: str | None
    ) -> rpc_pb2.AuthUserGetResponse:
        roles = M.user_get(self.auth, user, req.name)
        return rpc_pb2.AuthUserGetResponse(header=self.header(), roles=roles)

    async def _user_list(
        self, req: rpc_pb2.AuthUserListRequest, ctx: Ctx, user: str | None
    ) -> rpc_pb2.AuthUserListResponse:
        users = M.user_list(self.auth, user)
        return rpc_pb2.AuthUserListResponse(header=self.header(), users=users)

    async def _user_delete(
        self, req: rpc_pb2.AuthUserDeleteRequest, ctx: Ctx, user: str | None
    ) -> rpc_pb2.AuthUserDeleteResponse:
        await M.user_delete(self.auth, user, req.name)
        return rpc_pb2.AuthUserDeleteResponse(header=self.header())

    async def _user_change_password(
        self, req: rpc_pb2.AuthUserChangePasswordRequest, ctx: Ctx, user: str | None
    ) -> rpc_pb2.AuthUserChangePasswordResponse:
        password = M.new_password(req.password, hashed=bool(req.hashedPassword))
        await M.user_change_password(self.auth, user, req.name, password)
        return rpc_pb2.AuthUserChangePasswordResponse(header=self.header())

    async def _user_grant_role(
        self, req: rpc_pb2.AuthUserGrantRoleRequest, ctx: Ctx, user: str | None
    ) -> rpc_pb2.AuthUserGrantRoleResponse:
        await M.user_grant_role(self.auth, user, req.user, req.role)
        return rpc_pb2.AuthUserGrantRoleResponse(header=self.header())

    async def _user_revoke_role(
        self, req: rpc_pb2.AuthUserRevokeRoleRequest, ctx: Ctx, user: str | None
    ) -> rpc_pb2.AuthUserRevokeRoleResponse:
        await M.user_revoke_role(self.auth, user, req.name, req.role)
        return rpc_pb2.AuthUserRevokeRoleResponse(header=self.header())

    async def _role_add(
        self, req: rpc_pb2.AuthRoleAddRequest, ctx: Ctx, user: str | None
    ) -> rpc_pb2.AuthRoleAddResponse:
        await M.role_add(self.auth, user, req.name)
        return rpc_pb2.AuthRoleAddResponse(header=self.header())

    async def _role_get(
        self, req: rpc_pb2.AuthRoleGetRequest, ctx: Ctx, user: str | None
    ) -> rpc_pb2.AuthRoleGetResponse:
        perms = M.role_get(self.auth, user, req.role)
        return rpc_pb2.AuthRoleGetResponse(
            header=self.header(), perm=[perm_to_pb(p) for p in perms]
        )

    async def _role_list(
        self, req: rpc_pb2.AuthRoleListRequest, ctx: Ctx, user: str | None
    ) -> rpc_pb2.AuthRoleListResponse:
        roles = M.role_list(self.auth, user)
        return rpc_pb2.AuthRoleListResponse(header=self.header(), roles=roles)

    async def _role_delete(
        self, req: rpc_pb2.AuthRoleDeleteRequest, ctx: Ctx, user: str | None
    ) -> rpc_pb2.AuthRoleDeleteResponse:
        await M.role_delete(self.auth, user, req.role)
        return rpc_pb2.AuthRoleDeleteResponse(header=self.header())

    async def _role_grant_permission(
        self, req: rpc_pb2.AuthRoleGrantPermissionRequest, ctx: Ctx, user: str | None
    ) -> rpc_pb2.AuthRoleGrantPermissionResponse:
        perm = perm_from_pb(req.perm) if req.HasField("perm") else None
        await M.role_grant_permission(self.auth, user, req.name, perm)
        return rpc_pb2.AuthRoleGrantPermissionResponse(header=self.header())

    async def _role_revoke_permission(
        self, req: rpc_pb2.AuthRoleRevokePermissionRequest, ctx: Ctx, user: str | None
    ) -> rpc_pb2.AuthRoleRevokePermissionResponse:
        await M.role_revoke_permission(self.auth, user, req.role, req.key, req.range_end)
        return rpc_pb2.AuthRoleRevokePermissionResponse(header=self.header())

    def methods(self) -> dict[str, Method]:
        u = self._unary
        return service_handler(
            "etcdserverpb.Auth",
            {
                "AuthEnable": (u(self._auth_enable), rpc_pb2.AuthEnableRequest),
                "AuthDisable": (u(self._auth_disable), rpc_pb2.AuthDisableRequest),
                "AuthStatus": (u(self._auth_status), rpc_pb2.AuthStatusRequest),
                "Authenticate": (u(self._authenticate), rpc_pb2.AuthenticateRequest),
                "UserAdd": (u(self._user_add), rpc_pb2.AuthUserAddRequest),
                "UserGet": (u(self._user_get), rpc_pb2.AuthUserGetRequest),
                "UserList": (u(self._user_list), rpc_pb2.AuthUserListRequest),
                "UserDelete": (u(self._user_delete), rpc_pb2.AuthUserDeleteRequest),
                "UserChangePassword": (
                    u(self._user_change_password),
                    rpc_pb2.AuthUserChangePasswordRequest,
                ),
                "UserGrantRole": (u(self._user_grant_role), rpc_pb2.AuthUserGrantRoleRequest),
                "UserRevokeRole": (u(self._user_revoke_role), rpc_pb2.AuthUserRevokeRoleRequest),
                "RoleAdd": (u(self._role_add), rpc_pb2.AuthRoleAddRequest),
                "RoleGet": (u(self._role_get), rpc_pb2.AuthRoleGetRequest),
                "RoleList": (u(self._role_list), rpc_pb2.AuthRoleListRequest),
                "RoleDelete": (u(self._role_delete), rpc_pb2.AuthRoleDeleteRequest),
                "RoleGrantPermission": (
                    u(self._role_grant_permission),
                    rpc_pb2.AuthRoleGrantPermissionRequest,
                ),
                "RoleRevokePermission": (
                    u(self._role_revoke_permission),
                    rpc_pb2.AuthRoleRevokePermissionRequest,
                ),
            },
        )
