"""etcd's Maintenance calls over the JSON gateway: ``defragment``, ``hash``, ``hashkv``,
``transfer-leadership`` (shapes, refusals, auth: root only) over a ``LocalKV``, the same
calls against three in-process members (hashes equal everywhere, leadership really moved),
and ``snapshot``: raftkv's own file (``{"format": "raftkv"}``) produced one chunk of the
store's stream per loop turn and failing midway with an error line; etcd's bolt file by
default, with exact ``remaining_bytes`` and its SHA-256; an unknown format refused.

Shapes as etcd 3.4.23's gateway answered the same requests (``/usr/bin/etcd``; see
``test_etcd_compat.py`` for the mechanical comparison), but for the header etcd leaves out of
its Defragment and MoveLeader answers (``{}``), which ours carry as our gRPC answers do.
"""

from __future__ import annotations

import asyncio
import base64
import hashlib
import io
import json
import types
from typing import Any

import aiohttp

from bolt import BoltReader
from kvserver.archive import snapfile
from kvserver.etcdsnap.importer import read_etcd_db
from kvserver.kvpb.kv import CompactionRequest, DeleteRangeRequest, PutRequest
from kvserver.mvcc import snapshot as mvcc_snapshot
from kvserver.mvcc.hashkv import hash_kv
from kvserver.mvcc.store import MVCCStore
from tests.auth.helpers import auth_kv
from tests.support.inprocess import configs, running, wait_leader
from tests.support.wait import async_wait_for

from .fakes import DEFAULT_CLUSTER_ID, DEFAULT_MEMBER_ID, LocalKV
from .helpers import Api, b64, serve

CID, MID = str(DEFAULT_CLUSTER_ID), str(DEFAULT_MEMBER_ID)
FUTURE = "etcdserver: mvcc: required revision is a future revision"
COMPACTED = "etcdserver: mvcc: required revision has been compacted"
WAIT_S = 15.0


def hdr(revision: int) -> dict[str, str]:
    return {"cluster_id": CID, "member_id": MID, "revision": str(revision), "raft_term": "2"}


def error(status: int, code: int, text: str) -> tuple[int, dict[str, Any]]:
    return status, {"error": text, "message": text, "code": code}


async def put_history(api: Api) -> int:
    """Puts, overwrites and a delete; the last revision."""
    for i in range(5):
        await api.service.put(PutRequest(b"k%d" % i, b"v%d" % i))
    await api.service.put(PutRequest(b"k0", b"again"))
    return (await api.service.delete_range(DeleteRangeRequest(b"k1"))).header.revision


async def test_defragment_answers_the_header_and_changes_nothing() -> None:
    async with serve() as api:
        rev = await put_history(api)
        before, size = api.snapshot(), api.service.status().db_size_bytes
        for raw in ("{}", "", "null", '{"unknown": 1}'):
            assert await api.post("/v3/maintenance/defragment", raw=raw) == (
                200,
                {"header": hdr(rev)},
            )
        assert api.snapshot() == before and api.service.status().db_size_bytes == size
        # etcd: "json: cannot unmarshal array into Go value ...", 400 InvalidArgument
        status, body = await api.post("/v3/maintenance/defragment", raw="[]")
        assert (status, body["code"]) == (400, 3)


async def test_hash_and_hashkv_use_etcd_field_names() -> None:
    async with serve() as api:
        rev = await put_history(api)
        store = api.service.store
        whole = hash_kv(store, 0).hash
        # etcd 3.4: {"header":{...},"hash":2961143316} (uint32: a JSON number)
        assert await api.post("/v3/maintenance/hash", {}) == (
            200,
            {"header": hdr(rev), "hash": whole},
        )
        status, body = await api.post("/v3/maintenance/hashkv", {})
        assert status == 200 and list(body) == [
            "header",
            "hash",
            "compact_revision",
            "hash_revision",
        ]
        assert body == {
            "header": hdr(rev),
            "hash": whole,
            "compact_revision": "-1",  # never compacted, as etcd says it
            "hash_revision": str(rev),
        }
        at = rev - 2
        expect = {
            "header": hdr(rev),
            "hash": hash_kv(store, at).hash,
            "compact_revision": "-1",
            "hash_revision": str(at),
        }
        assert expect["hash"] != whole
        for raw in (f'{{"revision":"{at}"}}', f'{{"revision":{at}}}'):
            assert await api.post("/v3beta/maintenance/hashkv", raw=raw) == (200, expect)
        assert await api.post("/v3/maintenance/hashkv", {"revision": rev + 1}) == error(
            400, 11, FUTURE
        )
        await api.service.compact(CompactionRequest(at))
        assert await api.post("/v3/maintenance/hashkv", {"revision": at}) == error(
            400, 11, COMPACTED
        )
        status, body = await api.post("/v3/maintenance/hashkv", {"revision": at + 1})
        assert status == 200
        assert (body["compact_revision"], body["hash_revision"]) == (str(at), str(at + 1))
        assert body["hash"] == hash_kv(store, at + 1).hash
        for bad in ('{"revision":"abc"}', '{"revision":1.5}', '"x"'):
            status, body = await api.post("/v3/maintenance/hashkv", raw=bad)
            assert (status, body["code"]) == (400, 3), bad
        status, body = await api.post("/v3/maintenance/hash", raw="[]")
        assert (status, body["code"]) == (400, 3)


async def test_transfer_leadership_checks_as_etcd_and_moves_the_leader() -> None:
    async with serve() as api:
        bad = error(412, 9, "etcdserver: bad leader transferee")
        # etcd 3.4 answered these exactly so (no target: 0, which is no member)
        assert await api.post("/v3/maintenance/transfer-leadership", {}) == bad
        assert await api.post("/v3/maintenance/transfer-leadership", {"targetID": "123"}) == bad
        for target in (MID, int(MID)):  # already the leader: done at once
            assert await api.post("/v3/maintenance/transfer-leadership", {"targetID": target}) == (
                200,
                {"header": hdr(1)},
            )
        for raw in ('{"targetID":"-1"}', '{"targetID":"x"}', '{"targetID":-1}'):
            status, body = await api.post("/v3/maintenance/transfer-leadership", raw=raw)
            assert (status, body["code"]) == (400, 3), raw
        learner = await api.service.member_add(["http://127.0.0.1:2"], True)
        target = {"targetID": str(learner.member.id)}
        assert await api.post("/v3/maintenance/transfer-leadership", target) == bad
        voter = await api.service.member_add(["http://127.0.0.1:3"], False)
        target = {"targetID": str(voter.member.id)}
        status, body = await api.post("/v3/maintenance/transfer-leadership", target)
        assert status == 200 and body["header"]["member_id"] == MID
        assert api.service.leader == voter.member.id
        # No longer the leader: refused, not forwarded (etcd's MoveLeader is leader-only).
        assert await api.post("/v3/maintenance/transfer-leadership", target) == error(
            412, 9, "etcdserver: not leader"
        )


async def test_downgrade_is_unimplemented_and_a_wrong_method_is_405() -> None:
    async with serve() as api:
        status, body = await api.post("/v3/maintenance/downgrade", {"version": "3.4.0"})
        assert status == 501 and body["code"] == 12
        assert "Downgrade is not supported" in body["error"]
        for path in (
            "/v3/maintenance/defragment",
            "/v3/maintenance/hashkv",
            "/v3beta/maintenance/transfer-leadership",
            "/v3/maintenance/snapshot",
            "/v3/maintenance/downgrade",
        ):
            status, raw, _ = await api.request("GET", path)
            assert status == 405 and json.loads(raw)["code"] == 12, path


async def test_with_auth_every_call_needs_root() -> None:
    async with serve(auth_kv()) as api:
        for path, body in [
            ("/v3/auth/user/add", {"name": "root", "password": "rootpw"}),
            ("/v3/auth/user/grant", {"user": "root", "role": "root"}),
            ("/v3/auth/user/add", {"name": "alice", "password": "alicepw"}),
            ("/v3/auth/enable", {}),
        ]:
            assert (await api.post(path, body))[0] == 200, path
        tokens = {}
        for name in ("root", "alice"):
            status, out = await api.post(
                "/v3/auth/authenticate", {"name": name, "password": name + "pw"}
            )
            assert status == 200
            tokens[name] = {"Authorization": out["token"]}
        calls = [
            ("/v3/maintenance/defragment", {}),
            ("/v3/maintenance/hash", {}),
            ("/v3/maintenance/hashkv", {}),
            ("/v3/maintenance/transfer-leadership", {"targetID": MID}),
        ]
        for path, body in calls:
            assert await api.post(path, body) == error(400, 3, "etcdserver: user name is empty")
            assert await api.post(path, body, headers=tokens["alice"]) == error(
                403, 7, "etcdserver: permission denied"
            )
            status, out = await api.post(path, body, headers=tokens["root"])
            assert status == 200 and out["header"]["member_id"] == MID, (path, out)
        assert api.service.calls["HashKVRequest"] == 2  # hash and hashkv, by root only
        assert api.service.calls["MoveLeaderRequest"] == 1


# --- three members --------------------------------------------------------------------------


def client_url(member) -> str:
    return member.cfg.advertise_client_urls[0]


async def test_on_three_members_hashes_agree_and_leadership_moves(tmp_path) -> None:
    async with running(configs(tmp_path)) as members, aiohttp.ClientSession() as session:

        async def post(member, path: str, body: Any) -> tuple[int, Any]:
            async with session.post(client_url(member) + path, json=body) as r:
                return r.status, await r.json()

        leader = await wait_leader(members)
        for i in range(20):
            status, _ = await post(leader, "/v3/kv/put", {"key": b64(f"k{i}"), "value": b64("v")})
            assert status == 200
        status, out = await post(leader, "/v3/kv/put", {"key": b64("k0"), "value": b64("w")})
        rev = int(out["header"]["revision"])

        def applied() -> bool:
            return all(m.kv.store.revision == rev for m in members)

        await async_wait_for(applied, WAIT_S, "every member at the last revision")
        for body in ({}, {"revision": str(rev - 1)}):
            answers = [await post(m, "/v3/maintenance/hashkv", body) for m in members]
            assert {s for s, _ in answers} == {200}
            assert len({(b["hash"], b["hash_revision"]) for _, b in answers}) == 1
            assert [b["header"]["member_id"] for _, b in answers] == [
                str(m.member_id) for m in members
            ]
            direct = await members[0].kv.hash_kv(int(body.get("revision", 0)))
            assert answers[0][1]["hash"] == direct.hash

        follower, other = [m for m in members if m is not leader]
        target = {"targetID": str(other.member_id)}
        assert await post(follower, "/v3/maintenance/transfer-leadership", target) == error(
            412, 9, "etcdserver: not leader"
        )
        status, out = await post(leader, "/v3/maintenance/transfer-leadership", target)
        assert status == 200 and out["header"]["member_id"] == str(leader.member_id)
        assert leader.node.leader == other.member_id  # answered once the target leads
        assert (await wait_leader(members)) is other


# --- snapshot -------------------------------------------------------------------------------

RAFTKV = json.dumps({"format": "raftkv"})


async def test_snapshot_by_default_is_etcds_bolt_file_with_its_hash() -> None:
    service = LocalKV()
    service.node = types.SimpleNamespace(applied=9, term=2)
    for i in range(300):
        service.store.apply(PutRequest(b"key%04d" % i, b"v" * 2000))
    service.store.apply(DeleteRangeRequest(b"key0000"))
    async with serve(service) as api:
        status, raw, _ = await api.request("POST", "/v3/maintenance/snapshot", data="{}")
        assert status == 200
        lines = [json.loads(line)["result"] for line in raw.splitlines()]
        data = b"".join(base64.b64decode(r["blob"]) for r in lines)
        assert data[-32:] == hashlib.sha256(data[:-32]).digest()
        remaining = [int(r.get("remaining_bytes", 0)) for r in lines]
        sent = [len(base64.b64decode(r["blob"])) for r in lines]
        assert remaining == [len(data) - sum(sent[: i + 1]) for i in range(len(lines))]
        summary = read_etcd_db(BoltReader(data[:-32])).summary
        assert (summary.revision, summary.keys, summary.versions) == (302, 299, 301)
        status, body = await api.post("/v3/maintenance/snapshot", {"format": "tar"})
        assert status == 400 and "format" in body["error"]
    assert service.store._open_streams == 0


async def test_snapshot_reads_one_chunk_of_the_store_per_loop_turn(monkeypatch) -> None:
    # A base section scanned 8 keys per step: 400 keys and no compaction give 50 stretches
    # that write nothing, each an empty chunk of the store's stream.
    monkeypatch.setattr(mvcc_snapshot, "_KEYS_PER_STEP", 8)
    service = LocalKV()
    service.node = types.SimpleNamespace(applied=401, term=2)  # what capture reads
    for i in range(400):
        service.store.apply(PutRequest(b"key%04d" % i, b"value"))
    store = service.store
    turns = 0
    chunk_turns: list[int] = []  # the loop turn each chunk of the store's stream was read in
    chunks: list[bytes] = []
    serialize = MVCCStore.serialize

    def counted(self: MVCCStore, chunk_size_bytes: int = 64 * 1024):
        stream = serialize(self, chunk_size_bytes)
        try:
            for chunk in stream:
                chunk_turns.append(turns)
                chunks.append(chunk)
                yield chunk
        finally:
            stream.close()

    monkeypatch.setattr(MVCCStore, "serialize", counted)

    async def count_turns() -> None:
        nonlocal turns
        while True:
            turns += 1
            await asyncio.sleep(0)

    ticker = asyncio.create_task(count_turns())
    try:
        async with serve(service) as api:
            status, raw, _ = await api.request("POST", "/v3/maintenance/snapshot", data=RAFTKV)
    finally:
        ticker.cancel()
    assert status == 200
    assert chunks.count(b"") >= 40
    # Every chunk in a turn of its own: nothing holds the loop for a stretch of the scan.
    assert len(set(chunk_turns)) == len(chunk_turns)
    lines = [json.loads(line)["result"] for line in raw.splitlines()]
    data = b"".join(base64.b64decode(r["blob"]) for r in lines)
    image = bytearray()
    info = snapfile.read(io.BytesIO(data), "http", on_image=image.extend)
    assert (info.revision, info.keys) == (401, 400)
    assert bytes(image).endswith(b"".join(chunks))  # after the lease frame
    # The file's layout, byte for byte: header, image, SHA-256 of both.
    head = snapfile.encode_header(info.header)
    assert data == head + image + hashlib.sha256(head + image).digest()
    assert store._open_streams == 0


async def test_snapshot_failing_midway_ends_with_an_error_line(monkeypatch) -> None:
    monkeypatch.setattr(mvcc_snapshot, "_KEYS_PER_STEP", 8)
    service = LocalKV()
    service.node = types.SimpleNamespace(applied=1, term=2)
    for i in range(400):
        service.store.apply(PutRequest(b"key%04d" % i, b"value"))
    store = service.store
    serialize = MVCCStore.serialize

    def failing(self: MVCCStore, chunk_size_bytes: int = 64 * 1024):
        stream = serialize(self, chunk_size_bytes)
        try:
            for n, chunk in enumerate(stream):
                if n == 30:
                    raise RuntimeError("disk on fire")
                yield chunk
        finally:
            stream.close()

    monkeypatch.setattr(MVCCStore, "serialize", failing)
    async with serve(service) as api:
        status, raw, _ = await api.request("POST", "/v3/maintenance/snapshot", data=RAFTKV)
    assert status == 200  # the stream had started: its last line says what went wrong
    last = json.loads(raw.splitlines()[-1])
    assert last["error"]["grpc_code"] == 13 and "disk on fire" in last["error"]["message"]
    await async_wait_for(lambda: store._open_streams == 0, WAIT_S, "the stream closed")
