"""The dashboard's server side (``kvserver.api.http.ui`` and ``ui_data``), without a browser.

Three in-process members. Pinned: the page and its vendored chart library are served from the
package (and listed in the wheel's package data); ``/ui/api/cluster`` agrees on one leader and
gives every follower's match index from the leader's progress; a key's history lists every
put and the delete, then starts at the compact revision after a compaction; the pipelines
view reads a fenced lock's queue (holder = smallest create revision = the fencing token), a
commit log and exactly-once markers from their keys; the write actions exist only with
``--ui-write``; with auth on the files stay open, data calls need a token, and a user
restricted to a prefix reads nothing outside it.
"""

from __future__ import annotations

import asyncio
import base64
import json
from pathlib import Path

import aiohttp

from kvserver.api.http import ui, ui_data
from kvserver.auth.perms import Permission, PermType
from kvserver.kvpb.kv import CompactionRequest, DeleteRangeRequest, PutRequest
from tests.support.auth_setup import enable_auth
from tests.support.inprocess import configs, running, wait_leader
from tests.support.wait import async_wait_for

ROOT = Path(__file__).resolve().parents[2]


def b64(data: bytes) -> str:
    return base64.b64encode(data).decode()


def url(member) -> str:
    return member.cfg.advertise_client_urls[0]


async def get(session, member, path, token=None):
    headers = {"Authorization": token} if token else {}
    async with session.get(url(member) + path, headers=headers) as resp:
        body = await resp.read()
        return resp.status, (json.loads(body) if body[:1] in (b"{", b"[") else body)


async def post(session, member, path, obj, token=None):
    headers = {"Authorization": token} if token else {}
    async with session.post(url(member) + path, json=obj, headers=headers) as resp:
        return resp.status, await resp.json(content_type=None)


def test_static_files_ship_as_package_data():
    names = set(ui.files())
    assert {"index.html", "app.js", "app.css", "vendor/dygraph.min.js"} <= names
    pyproject = (ROOT / "pyproject.toml").read_text()
    assert '"kvserver.api.http" = ["ui_static/*", "ui_static/vendor/*"]' in pyproject
    assert all(n.count("/") <= 1 for n in names), "package data globs cover two levels only"


async def test_cluster_history_pipelines_and_write_flag(tmp_path):
    async with running(configs(tmp_path, ui_write=True)) as members:
        leader = await wait_leader(members)
        follower = next(m for m in members if m is not leader)
        async with aiohttp.ClientSession() as s:
            status, page = await get(s, follower, "/ui/")
            assert status == 200 and b"raftkv dashboard" in page
            status, js = await get(s, follower, "/ui/vendor/dygraph.min.js")
            assert status == 200 and b"Dygraph" in js
            assert (await get(s, follower, "/ui/nope.js"))[0] == 404

            async def cluster_view():
                status, c = await get(s, follower, "/ui/api/cluster")
                assert status == 200
                return c if all(m["reachable"] for m in c["members"]) else None

            # Members publish their client URLs through raft soon after they start.
            c = None
            for _ in range(100):
                c = await cluster_view()
                if c is not None:
                    break
                await asyncio.sleep(0.1)
            assert c is not None, "every member reachable through its published client URL"
            assert c["leader"] == format(leader.member_id, "x")
            assert len(c["members"]) == 3
            assert [m["is_leader"] for m in c["members"]].count(True) == 1
            assert all(m["match"] is not None and m["lag"] >= 0 for m in c["members"])

            status, m = await get(s, follower, "/ui/api/metrics?scope=cluster")
            assert status == 200 and len(m["members"]) == 3
            assert m["fsync"]["counts"][-1] > 0  # every member has fsynced its log
            status, one = await get(s, follower, "/ui/api/metrics")
            assert one["members"] == [format(follower.member_id, "x")]

            # History: three puts and a delete, then a compaction cuts below its revision.
            kv = leader.kv
            for v in (b"v1", b"v2", b"v3"):
                await kv.put(PutRequest(b"app/k", v))
            await kv.delete_range(DeleteRangeRequest(b"app/k"))
            rev = (await kv.put(PutRequest(b"app/k", b"v4"))).header.revision
            key = b64(b"app/k")
            status, h = await get(s, leader, f"/ui/api/history?key={key}")
            assert status == 200, h
            assert [v["type"] for v in h["versions"]] == ["PUT", "PUT", "PUT", "DELETE", "PUT"]
            assert [base64.b64decode(v["value"]) for v in h["versions"] if v["type"] == "PUT"] == [
                b"v1",
                b"v2",
                b"v3",
                b"v4",
            ]
            await kv.compact(CompactionRequest(revision=rev - 1))  # at the delete
            status, h = await get(s, leader, f"/ui/api/history?key={key}")
            assert h["compact_revision"] == rev - 1
            assert [v["mod_revision"] for v in h["versions"]] == [rev]

            # Pipelines: a lock queue of two, a commit log, an exactly-once marker.
            lease_a = (await kv.lease_grant(30)).lease_id
            lease_b = (await kv.lease_grant(30)).lease_id
            ra = (
                await kv.put(
                    PutRequest(f"__raftkv/locks/job/{lease_a:016x}".encode(), lease=lease_a)
                )
            ).header.revision
            await kv.put(PutRequest(f"__raftkv/locks/job/{lease_b:016x}".encode(), lease=lease_b))
            payload = {"committer": "driver-1", "fence": ra, "files": 3}
            await kv.put(
                PutRequest(b"__raftkv/commitlog/t1/v/" + b"0" * 20, json.dumps(payload).encode())
            )
            record = {  # what CommitLog writes beside a version
                "committer": "job-7",
                "committed_at": 1700000000.5,
                "fence": {"key": "__raftkv/locks/job/x", "token": ra},
            }
            await kv.put(PutRequest(b"__raftkv/commitlog/t1/v/" + b"1".zfill(20), b"{}"))
            await kv.put(
                PutRequest(
                    b"__raftkv/commitlog/t1/m/" + b"1".zfill(20), json.dumps(record).encode()
                )
            )
            await kv.put(
                PutRequest(
                    b"__raftkv/batches/q1/" + b"7".zfill(20), b'{"batch_id":7,"finished_at":1.5}'
                )
            )
            status, p = await get(s, follower, "/ui/api/pipelines")
            assert status == 200
            (lock,) = p["locks"]["items"]
            assert lock["name"] == "job" and lock["token"] == ra
            assert len(lock["waiters"]) == 1
            (table,) = p["commitlogs"]["items"]
            newest, first = table["latest"]  # newest first; records are not versions
            assert (newest["version"], newest["committer"], newest["time"]) == (
                1,
                "job-7",
                1700000000.5,
            )
            assert newest["fence"] == f"{ra} (__raftkv/locks/job/x)"
            assert first["committer"] == "driver-1" and first["fence"] == ra
            (batch,) = p["batches"]["items"]
            assert batch["last_batch_id"] == 7 and batch["batches"] == 1

            # Writes through the dashboard, and moving the leader.
            status, r = await post(
                s, follower, "/ui/api/kv/put", {"key": b64(b"w"), "value": b64(b"1")}
            )
            assert status == 200 and r["revision"] > rev
            status, r = await post(s, follower, "/ui/api/kv/delete", {"key": b64(b"w")})
            assert status == 200 and r["deleted"] == 1
            target = format(follower.member_id, "x")
            status, r = await post(s, follower, "/ui/api/move-leader", {"to": target})
            assert status == 200, r
            await async_wait_for(lambda: follower.node.is_leader, 10.0, "the new leader")


async def test_read_only_by_default_and_auth(tmp_path):
    async with running(configs(tmp_path)) as members:
        leader = await wait_leader(members)
        await leader.kv.put(PutRequest(b"app/a", b"1"))
        await leader.kv.put(PutRequest(b"other/b", b"2"))
        read_app = Permission(PermType.READ, b"app/", b"app0")
        tokens = await enable_auth(leader, app=[read_app])
        async with aiohttp.ClientSession() as s:
            status, r = await post(
                s, leader, "/ui/api/kv/put", {"key": b64(b"x"), "value": ""}, tokens.root
            )
            assert status == 403 and "--ui-write" in r["error"]
            # The page is open; its data calls need a token and respect permissions.
            assert (await get(s, leader, "/ui/"))[0] == 200
            assert (await get(s, leader, "/ui/api/config"))[1]["auth_enabled"] is True
            status, _ = await get(s, leader, f"/ui/api/history?key={b64(b'app/a')}")
            assert status == 400  # etcdserver: user name is empty
            status, h = await get(s, leader, f"/ui/api/history?key={b64(b'app/a')}", tokens.alice)
            assert status == 200 and len(h["versions"]) == 1
            status, _ = await get(s, leader, f"/ui/api/history?key={b64(b'other/b')}", tokens.alice)
            assert status == 403
            status, p = await get(s, leader, "/ui/api/pipelines", tokens.alice)
            assert status == 200 and p["locks"] == {"denied": True, "prefix": "__raftkv/locks/"}
            status, p = await get(s, leader, "/ui/api/pipelines", tokens.root)
            assert status == 200 and p["locks"]["items"] == []
            # The gateway's range, which the key tree uses, refuses the other prefix.
            rng = {"key": b64(b"other/"), "range_end": b64(b"other0"), "keys_only": True}
            status, _ = await post(s, leader, "/v3/kv/range", rng, tokens.alice)
            assert status == 403


def test_archive_view_names_the_restorable_range():
    from kvserver.archive.manifest import Manifest, SnapshotObject

    class FakeArchiver:  # what ui_data reads of kvserver.archive.archiver.Archiver
        stats = {"errors": 0, "uploaded_bytes": 4096}
        last_error = None
        manifest = Manifest(
            cluster_id=1,
            member_id=2,
            updated_unix=1700000100.0,
            snapshots=[SnapshotObject("s1", index=10, term=2, revision=7, size=1, crc32c=0)],
            timeline=[[1700000000.0, 5], [1700000050.0, 12], [1700000100.0, 40]],
        )

        def lag(self):
            return 3, 1.5

    assert ui_data.archive_view(None) == {"enabled": False}
    view = ui_data.archive_view(FakeArchiver())
    assert view["lag_entries"] == 3 and view["last_upload_unix"] == 1700000100.0
    r = view["restorable"]
    assert (r["from_index"], r["from_revision"], r["from_unix"]) == (10, 7, 1700000050.0)
    assert r["to_unix"] == 1700000100.0
