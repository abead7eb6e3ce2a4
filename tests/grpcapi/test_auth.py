"""etcd's Auth service over gRPC, and the whole auth path of the gRPC API, end to end.

In-process members; clients are grpc.aio with our stubs and the real etcdctl 3.4 (a
subprocess of the test's loop). Checked: every Auth RPC, with the codes and texts a real
etcd 3.4 answers the same calls (AuthStatus, which 3.4 lacks, as etcd 3.5 has it; 3.4 has no
answer for a RoleGrantPermission without ``perm``, it crashes: we send etcd's
``auth: permission not given``; the ``raftkv:`` refusals are ours); who may call what once
auth is on (root for management; anyone for Authenticate and AuthStatus; oneself for
UserGet, a held role for RoleGet); KV calls without a token (``user name is empty``), with a
bad one (``invalid auth token``), and per-key permissions; the same refusals through the
JSON gateway; failed authentications bounded per client host, not per connection; and, with ``--client-cert-auth``, a client certificate's common name acting as
that user, for grpc.aio and etcdctl alike.
"""

from __future__ import annotations

import aiohttp
import grpc
import pytest

from kvserver.auth.errors import TooManyAuthFailuresError
from kvserver.etcdpb import auth_pb2, rpc_pb2, rpc_pb2_grpc
from tests.support.etcdctl import AsyncEtcdctl
from tests.support.grpc_members import dial, refused, token
from tests.support.inprocess import configs, running, wait_leader
from tests.tls.conftest import PKI, cluster_configs

CALL_TIMEOUT_S = 10.0
READWRITE = auth_pb2.Permission.READWRITE

EMPTY = (grpc.StatusCode.INVALID_ARGUMENT, "etcdserver: user name is empty")
INVALID_TOKEN = (grpc.StatusCode.UNAUTHENTICATED, "etcdserver: invalid auth token")
DENIED = (grpc.StatusCode.PERMISSION_DENIED, "etcdserver: permission denied")


class Stubs:
    def __init__(self, channel: grpc.aio.Channel):
        self.auth = rpc_pb2_grpc.AuthStub(channel)
        self.kv = rpc_pb2_grpc.KVStub(channel)

    async def login(self, name: str, password: str) -> tuple[tuple[str, str], ...]:
        r = await self.auth.Authenticate(
            rpc_pb2.AuthenticateRequest(name=name, password=password), timeout=CALL_TIMEOUT_S
        )
        assert r.token
        return token(r.token)


def perm(kind, key: bytes, range_end: bytes = b"") -> auth_pb2.Permission:
    return auth_pb2.Permission(permType=kind, key=key, range_end=range_end)


async def test_every_auth_call_over_grpc(tmp_path):
    async with running(configs(tmp_path)) as members:
        leader = await wait_leader(members)
        follower = next(m for m in members if m is not leader)
        async with dial(follower) as channel:
            s = Stubs(channel)
            a = s.auth
            status = await a.AuthStatus(rpc_pb2.AuthStatusRequest())
            assert not status.enabled
            first_revision = status.authRevision
            assert status.header.member_id == follower.member_id
            assert status.header.cluster_id == leader.cluster_id
            assert await refused(a.Authenticate(rpc_pb2.AuthenticateRequest(name="root"))) == (
                grpc.StatusCode.FAILED_PRECONDITION,
                "etcdserver: authentication is not enabled",
            )

            # Auth disabled: anyone manages users and roles.
            assert await refused(a.UserAdd(rpc_pb2.AuthUserAddRequest(password="x"))) == EMPTY
            no_password = rpc_pb2.AuthUserAddRequest(
                name="bob", options=auth_pb2.UserAddOptions(no_password=True)
            )
            assert await refused(a.UserAdd(no_password)) == (
                grpc.StatusCode.INVALID_ARGUMENT,
                "raftkv: users without a password are not supported",
            )
            hashed = rpc_pb2.AuthUserAddRequest(name="bob", hashedPassword="$2a$10$x")
            assert (await refused(a.UserAdd(hashed)))[1].startswith(
                "raftkv: pre-hashed passwords are not supported"
            )
            added = await a.UserAdd(rpc_pb2.AuthUserAddRequest(name="root", password="rootpw"))
            assert added.header.revision == status.header.revision  # no KV change
            await a.UserGrantRole(rpc_pb2.AuthUserGrantRoleRequest(user="root", role="root"))
            await a.RoleAdd(rpc_pb2.AuthRoleAddRequest(name="app"))
            await a.RoleAdd(rpc_pb2.AuthRoleAddRequest(name="other"))
            await a.RoleGrantPermission(
                rpc_pb2.AuthRoleGrantPermissionRequest(
                    name="app", perm=perm(READWRITE, b"a/", b"a0")
                )
            )
            await a.RoleGrantPermission(
                rpc_pb2.AuthRoleGrantPermissionRequest(
                    name="app", perm=perm(auth_pb2.Permission.READ, b"cfg")
                )
            )
            assert await refused(
                a.RoleGrantPermission(rpc_pb2.AuthRoleGrantPermissionRequest(name="app"))
            ) == (grpc.StatusCode.UNKNOWN, "auth: permission not given")
            bad_type = rpc_pb2.AuthRoleGrantPermissionRequest(name="app", perm=perm(7, b"z"))
            assert await refused(a.RoleGrantPermission(bad_type)) == (
                grpc.StatusCode.INVALID_ARGUMENT,
                "raftkv: unknown permission type 7",
            )
            await a.UserAdd(rpc_pb2.AuthUserAddRequest(name="alice", password="alicepw"))
            await a.UserGrantRole(rpc_pb2.AuthUserGrantRoleRequest(user="alice", role="app"))

            got = await a.UserGet(rpc_pb2.AuthUserGetRequest(name="alice"))
            assert list(got.roles) == ["app"]
            role = await a.RoleGet(rpc_pb2.AuthRoleGetRequest(role="app"))
            assert [(p.permType, p.key, p.range_end) for p in role.perm] == [
                (READWRITE, b"a/", b"a0"),
                (auth_pb2.Permission.READ, b"cfg", b""),
            ]
            assert list((await a.UserList(rpc_pb2.AuthUserListRequest())).users) == [
                "alice",
                "root",
            ]
            assert list((await a.RoleList(rpc_pb2.AuthRoleListRequest())).roles) == [
                "app",
                "other",
            ]
            assert await refused(a.RoleGet(rpc_pb2.AuthRoleGetRequest(role="nosuch"))) == (
                grpc.StatusCode.FAILED_PRECONDITION,
                "etcdserver: role name not found",
            )
            assert await refused(a.UserGet(rpc_pb2.AuthUserGetRequest(name="nosuch"))) == (
                grpc.StatusCode.FAILED_PRECONDITION,
                "etcdserver: user name not found",
            )
            await s.kv.Put(rpc_pb2.PutRequest(key=b"b/secret", value=b"s"))

            await a.AuthEnable(rpc_pb2.AuthEnableRequest())
            status = await a.AuthStatus(rpc_pb2.AuthStatusRequest())
            assert status.enabled and status.authRevision > first_revision

            # Auth enabled: credentials are needed, and checked per key.
            assert await refused(s.kv.Range(rpc_pb2.RangeRequest(key=b"a/1"))) == EMPTY
            bogus = token("bogus.1")
            assert await refused(s.kv.Range(rpc_pb2.RangeRequest(key=b"a/1"), metadata=bogus)) == (
                INVALID_TOKEN
            )
            assert await refused(a.UserList(rpc_pb2.AuthUserListRequest())) == EMPTY
            assert await refused(a.UserGet(rpc_pb2.AuthUserGetRequest(name="alice"))) == EMPTY
            assert await refused(a.UserList(rpc_pb2.AuthUserListRequest(), metadata=bogus)) == (
                INVALID_TOKEN
            )
            wrong = rpc_pb2.AuthenticateRequest(name="alice", password="nope")
            assert await refused(a.Authenticate(wrong)) == (
                grpc.StatusCode.INVALID_ARGUMENT,
                "etcdserver: authentication failed, invalid user ID or password",
            )
            alice = await s.login("alice", "alicepw")
            root = await s.login("root", "rootpw")

            put = await s.kv.Put(rpc_pb2.PutRequest(key=b"a/1", value=b"x"), metadata=alice)
            assert put.header.revision > 0
            got_kv = await s.kv.Range(
                rpc_pb2.RangeRequest(key=b"a/", range_end=b"a0"), metadata=alice
            )
            assert [kv.key for kv in got_kv.kvs] == [b"a/1"]
            for call in (
                s.kv.Put(rpc_pb2.PutRequest(key=b"b/1", value=b"x"), metadata=alice),
                s.kv.Range(rpc_pb2.RangeRequest(key=b"a", range_end=b"b"), metadata=alice),
                s.kv.Range(rpc_pb2.RangeRequest(key=b"b/secret"), metadata=alice),
                s.kv.Put(rpc_pb2.PutRequest(key=b"cfg", value=b"x"), metadata=alice),
                s.kv.DeleteRange(rpc_pb2.DeleteRangeRequest(key=b"b/secret"), metadata=alice),
                s.kv.Txn(
                    rpc_pb2.TxnRequest(
                        compare=[rpc_pb2.Compare(key=b"b/secret", target=rpc_pb2.Compare.VERSION)],
                        success=[
                            rpc_pb2.RequestOp(
                                request_put=rpc_pb2.PutRequest(key=b"a/2", value=b"y")
                            )
                        ],
                    ),
                    metadata=alice,
                ),
            ):
                assert await refused(call) == DENIED
            secret = await s.kv.Range(rpc_pb2.RangeRequest(key=b"b/secret"), metadata=root)
            assert secret.kvs[0].value == b"s"

            # What a non-root user may and may not do with the Auth service.
            mine = await a.UserGet(rpc_pb2.AuthUserGetRequest(name="alice"), metadata=alice)
            assert list(mine.roles) == ["app"]
            held = await a.RoleGet(rpc_pb2.AuthRoleGetRequest(role="app"), metadata=alice)
            assert len(held.perm) == 2
            assert (await a.AuthStatus(rpc_pb2.AuthStatusRequest(), metadata=alice)).enabled
            for call in (
                a.UserGet(rpc_pb2.AuthUserGetRequest(name="root"), metadata=alice),
                a.RoleGet(rpc_pb2.AuthRoleGetRequest(role="other"), metadata=alice),
                a.RoleGet(rpc_pb2.AuthRoleGetRequest(role="root"), metadata=alice),
                a.UserList(rpc_pb2.AuthUserListRequest(), metadata=alice),
                a.RoleList(rpc_pb2.AuthRoleListRequest(), metadata=alice),
                a.UserAdd(rpc_pb2.AuthUserAddRequest(name="eve", password="x"), metadata=alice),
                a.UserGrantRole(
                    rpc_pb2.AuthUserGrantRoleRequest(user="alice", role="root"), metadata=alice
                ),
                a.RoleGrantPermission(
                    rpc_pb2.AuthRoleGrantPermissionRequest(name="app", perm=perm(READWRITE, b"b")),
                    metadata=alice,
                ),
                a.UserChangePassword(
                    rpc_pb2.AuthUserChangePasswordRequest(name="alice", password="x"),
                    metadata=alice,
                ),
                a.AuthDisable(rpc_pb2.AuthDisableRequest(), metadata=alice),
            ):
                assert await refused(call) == DENIED

            # The JSON gateway on the same URL refuses the same way, with the same texts.
            url = follower.cfg.advertise_client_urls[0]
            async with aiohttp.ClientSession() as http:
                async with http.post(
                    url + "/v3/auth/user/list",
                    json={},
                    headers={"Authorization": dict(alice)["token"]},
                ) as resp:
                    assert resp.status == 403
                    assert (await resp.json())["message"] == DENIED[1]
                async with http.post(
                    url + "/v3/auth/user/add",
                    json={"name": "bob", "options": {"no_password": True}},
                    headers={"Authorization": dict(root)["token"]},
                ) as resp:
                    assert resp.status == 400
                    assert (await resp.json())["message"] == (
                        "raftkv: users without a password are not supported"
                    )

            # Root manages; a changed password ends the user's tokens.
            get_root = a.RoleGet(rpc_pb2.AuthRoleGetRequest(role="root"), metadata=root)
            assert await refused(get_root) == (
                grpc.StatusCode.FAILED_PRECONDITION,
                "etcdserver: role name not found",  # granted, never added: as in etcd
            )
            await a.RoleAdd(rpc_pb2.AuthRoleAddRequest(name="root"), metadata=root)
            root_role = await a.RoleGet(rpc_pb2.AuthRoleGetRequest(role="root"), metadata=root)
            assert [(p.permType, p.key, p.range_end) for p in root_role.perm] == [
                (READWRITE, b"", b"\0")
            ]
            await a.UserChangePassword(
                rpc_pb2.AuthUserChangePasswordRequest(name="alice", password="newpw"),
                metadata=root,
            )
            assert (
                await refused(s.kv.Range(rpc_pb2.RangeRequest(key=b"a/1"), metadata=alice))
                == INVALID_TOKEN
            )
            alice = await s.login("alice", "newpw")
            await a.UserRevokeRole(
                rpc_pb2.AuthUserRevokeRoleRequest(name="alice", role="app"), metadata=root
            )
            assert await refused(s.kv.Range(rpc_pb2.RangeRequest(key=b"a/1"), metadata=alice)) == (
                DENIED
            )
            assert await refused(
                a.UserRevokeRole(
                    rpc_pb2.AuthUserRevokeRoleRequest(name="alice", role="app"), metadata=root
                )
            ) == (
                grpc.StatusCode.FAILED_PRECONDITION,
                "etcdserver: role is not granted to the user",
            )
            await a.RoleRevokePermission(
                rpc_pb2.AuthRoleRevokePermissionRequest(role="app", key=b"cfg"), metadata=root
            )
            assert await refused(
                a.RoleRevokePermission(
                    rpc_pb2.AuthRoleRevokePermissionRequest(role="app", key=b"cfg"), metadata=root
                )
            ) == (
                grpc.StatusCode.FAILED_PRECONDITION,
                "etcdserver: permission is not granted to the role",
            )
            assert await refused(
                a.UserDelete(rpc_pb2.AuthUserDeleteRequest(name="root"), metadata=root)
            ) == (grpc.StatusCode.INVALID_ARGUMENT, "etcdserver: invalid auth management")
            await a.RoleDelete(rpc_pb2.AuthRoleDeleteRequest(role="other"), metadata=root)
            await a.UserDelete(rpc_pb2.AuthUserDeleteRequest(name="alice"), metadata=root)
            users = await a.UserList(rpc_pb2.AuthUserListRequest(), metadata=root)
            roles = await a.RoleList(rpc_pb2.AuthRoleListRequest(), metadata=root)
            assert (list(users.users), list(roles.roles)) == (["root"], ["app", "root"])

            await a.AuthDisable(rpc_pb2.AuthDisableRequest(), metadata=root)
            assert not (await a.AuthStatus(rpc_pb2.AuthStatusRequest())).enabled
            assert (await s.kv.Range(rpc_pb2.RangeRequest(key=b"b/secret"))).kvs[0].value == b"s"

        # Every member applied the same auth state (the writes went through a follower).
        revisions = {m.kv.auth.store.revision for m in members}
        assert len(revisions) == 1


async def test_failed_authentications_are_bounded_per_client_host(tmp_path):
    """The failure limiter counts a gRPC client by its host: new connections (new ports) do
    not give it new attempts."""
    async with running(cluster_configs(tmp_path)) as members:
        member = await wait_leader(members)
        limiter = member.kv.auth.limiter
        limiter.clock = lambda: 1000.0  # frozen: no attempt comes back during the test

        def connect() -> grpc.aio.Channel:  # a connection of its own, not a shared one
            return dial(member, options=[("grpc.use_local_subchannel_pool", 1)])

        async with connect() as ch:
            a = rpc_pb2_grpc.AuthStub(ch)
            await a.UserAdd(rpc_pb2.AuthUserAddRequest(name="root", password="rootpw"))
            await a.UserGrantRole(rpc_pb2.AuthUserGrantRoleRequest(user="root", role="root"))
            await a.AuthEnable(rpc_pb2.AuthEnableRequest())
        accepted = member.grpc.connections_accepted
        wrong = rpc_pb2.AuthenticateRequest(name="root", password="nope")
        for _ in range(limiter.burst):
            async with connect() as ch:
                assert await refused(rpc_pb2_grpc.AuthStub(ch).Authenticate(wrong)) == (
                    grpc.StatusCode.INVALID_ARGUMENT,
                    "etcdserver: authentication failed, invalid user ID or password",
                )
        async with connect() as ch:
            right = rpc_pb2.AuthenticateRequest(name="root", password="rootpw")
            code, text = await refused(rpc_pb2_grpc.AuthStub(ch).Authenticate(right))
        assert code is grpc.StatusCode.RESOURCE_EXHAUSTED
        assert text == TooManyAuthFailuresError.default_message
        # distinct connections
        assert member.grpc.connections_accepted >= accepted + limiter.burst + 1


# --- etcdctl ----------------------------------------------------------------------------------


def etcdctl(endpoints: list[str], *tls: str) -> AsyncEtcdctl:
    return AsyncEtcdctl(endpoints, "--command-timeout=10s", "--dial-timeout=5s", *tls)


@pytest.mark.external
async def test_etcdctl_auth_commands(tmp_path):
    async with running(configs(tmp_path)) as members:
        await wait_leader(members)
        ctl = etcdctl([m.cfg.advertise_client_urls[0] for m in members])
        assert await ctl.run("user", "add", "root", "--new-user-password=rootpw") == (
            "User root created\n"
        )
        assert await ctl.run("user", "grant-role", "root", "root") == (
            "Role root is granted to user root\n"
        )
        assert await ctl.run("role", "add", "app") == "Role app created\n"
        assert await ctl.run("role", "grant-permission", "app", "--prefix", "readwrite", "a/") == (
            "Role app updated\n"
        )
        await ctl.run("user", "add", "alice", "--new-user-password=alicepw")
        await ctl.run("user", "grant-role", "alice", "app")
        assert await ctl.run("role", "get", "app") == (
            "Role app\nKV Read:\n\t[a/, a0) (prefix a/)\nKV Write:\n\t[a/, a0) (prefix a/)\n"
        )
        assert await ctl.run("user", "get", "alice") == "User: alice\nRoles: app\n"
        assert await ctl.run("user", "list") == "alice\nroot\n"
        await ctl.run("put", "b/secret", "s")
        assert await ctl.run("auth", "enable") == "Authentication Enabled\n"

        as_root = ("--user", "root:rootpw")
        as_alice = ("--user", "alice:alicepw")
        assert await ctl.run(*as_root, "get", "b/secret") == "b/secret\ns\n"
        assert await ctl.run(*as_alice, "put", "a/1", "x") == "OK\n"
        assert await ctl.run(*as_alice, "get", "a/", "--prefix") == "a/1\nx\n"
        assert "etcdserver: permission denied" in await ctl.fails(*as_alice, "get", "b/secret")
        assert "etcdserver: permission denied" in await ctl.fails(*as_alice, "user", "list")
        assert "etcdserver: user name is empty" in await ctl.fails("get", "a/1")
        assert "authentication failed" in await ctl.fails("--user", "root:wrong", "get", "a/1")
        assert await ctl.run(*as_alice, "user", "get", "alice") == "User: alice\nRoles: app\n"
        assert await ctl.run(*as_root, "user", "list") == "alice\nroot\n"
        assert await ctl.run(*as_root, "auth", "disable") == "Authentication Disabled\n"
        assert await ctl.run("get", "b/secret") == "b/secret\ns\n"


# --- client certificates --------------------------------------------------------------------


class CertMember:
    """One https member with ``--client-cert-auth``; ``channel(cn)`` dials it with a client
    certificate whose common name is ``cn``, ``etcdctl_tls(cn)`` gives etcdctl's flags for one."""

    def __init__(self, tmp_path):
        self.pki = PKI(tmp_path / "pki")
        server = self.pki.pair("member")
        self.cfgs = cluster_configs(
            tmp_path,
            client="https",
            cert_file=server.cert,
            key_file=server.key,
            trusted_ca_file=self.pki.ca_file,
            client_cert_auth=True,
        )
        self.url = self.cfgs[0].advertise_client_urls[0]

    def channel(self, cn: str) -> grpc.aio.Channel:
        pair = self.pki.pair(f"grpc-{cn}", common_name=cn)
        with (
            open(self.pki.ca_file, "rb") as ca,
            open(pair.key, "rb") as k,
            open(pair.cert, "rb") as c,
        ):
            creds = grpc.ssl_channel_credentials(ca.read(), k.read(), c.read())
        return grpc.aio.secure_channel(self.url.removeprefix("https://"), creds)

    def etcdctl_tls(self, cn: str) -> list[str]:
        pair = self.pki.pair(f"ctl-{cn}", common_name=cn)
        return [f"--cacert={self.pki.ca_file}", f"--cert={pair.cert}", f"--key={pair.key}"]

    async def set_up(self) -> None:
        """As the certificate ``root`` while auth is off: users root and alice (role app:
        readwrite ``a/``), key ``b/secret``; then auth on."""
        async with self.channel("root") as ch:
            s = Stubs(ch)
            a = s.auth
            await a.UserAdd(rpc_pb2.AuthUserAddRequest(name="root", password="rootpw"))
            await a.UserGrantRole(rpc_pb2.AuthUserGrantRoleRequest(user="root", role="root"))
            await a.RoleAdd(rpc_pb2.AuthRoleAddRequest(name="app"))
            app = perm(READWRITE, b"a/", b"a0")
            await a.RoleGrantPermission(
                rpc_pb2.AuthRoleGrantPermissionRequest(name="app", perm=app)
            )
            await a.UserAdd(rpc_pb2.AuthUserAddRequest(name="alice", password="alicepw"))
            await a.UserGrantRole(rpc_pb2.AuthUserGrantRoleRequest(user="alice", role="app"))
            await s.kv.Put(rpc_pb2.PutRequest(key=b"b/secret", value=b"s"))
            await a.AuthEnable(rpc_pb2.AuthEnableRequest())


async def test_client_certificate_is_the_user(tmp_path):
    cm = CertMember(tmp_path)
    async with running(cm.cfgs) as members:
        await wait_leader(members)
        await cm.set_up()
        async with cm.channel("root") as ch:
            s = Stubs(ch)
            # Auth is on: the certificate alone makes this client root (no token).
            users = await s.auth.UserList(rpc_pb2.AuthUserListRequest())
            assert list(users.users) == ["alice", "root"]
            await s.kv.Put(rpc_pb2.PutRequest(key=b"b/other", value=b"o"))
            root = await s.login("root", "rootpw")
        async with cm.channel("alice") as ch:
            s = Stubs(ch)
            await s.kv.Put(rpc_pb2.PutRequest(key=b"a/1", value=b"x"))
            assert (await s.kv.Range(rpc_pb2.RangeRequest(key=b"a/1"))).kvs[0].value == b"x"
            assert await refused(s.kv.Range(rpc_pb2.RangeRequest(key=b"b/secret"))) == DENIED
            assert await refused(s.auth.UserList(rpc_pb2.AuthUserListRequest())) == DENIED
            mine = await s.auth.UserGet(rpc_pb2.AuthUserGetRequest(name="alice"))
            assert list(mine.roles) == ["app"]
            # A token, when sent, wins over the certificate (as in etcd).
            got = await s.kv.Range(rpc_pb2.RangeRequest(key=b"b/secret"), metadata=root)
            assert got.kvs[0].value == b"s"
            bogus = token("bogus.1")
            assert await refused(s.kv.Range(rpc_pb2.RangeRequest(key=b"a/1"), metadata=bogus)) == (
                INVALID_TOKEN
            )
        async with cm.channel("mallory") as ch:
            s = Stubs(ch)  # a common name that is no user
            assert await refused(s.kv.Put(rpc_pb2.PutRequest(key=b"a/2", value=b"x"))) == DENIED
            assert await refused(s.auth.RoleGet(rpc_pb2.AuthRoleGetRequest(role="app"))) == DENIED
            assert await refused(s.auth.AuthDisable(rpc_pb2.AuthDisableRequest())) == DENIED


@pytest.mark.external
async def test_etcdctl_with_a_client_certificate(tmp_path):
    cm = CertMember(tmp_path)
    async with running(cm.cfgs) as members:
        await wait_leader(members)
        await cm.set_up()
        root = etcdctl([cm.url], *cm.etcdctl_tls("root"))
        alice = etcdctl([cm.url], *cm.etcdctl_tls("alice"))
        assert await root.run("get", "b/secret") == "b/secret\ns\n"
        assert await root.run("user", "list") == "alice\nroot\n"
        assert await alice.run("put", "a/3", "z") == "OK\n"
        assert await alice.run("get", "a/", "--prefix", "--keys-only") == "a/3\n\n"
        assert "etcdserver: permission denied" in await alice.fails("get", "b/secret")
        assert "etcdserver: permission denied" in await alice.fails("user", "list")
        assert await alice.run("user", "get", "alice") == "User: alice\nRoles: app\n"
        # --user wins over the certificate
        assert await alice.run("--user", "root:rootpw", "get", "b/secret") == "b/secret\ns\n"
        assert "authentication failed" in await alice.fails("--user", "root:nope", "get", "a/3")
        assert await root.run("auth", "disable") == "Authentication Disabled\n"
        assert await alice.run("get", "b/secret") == "b/secret\ns\n"
