"""The etcd v3 JSON gateway's cluster endpoints over ``LocalKV`` (``LocalMembership``), with
etcd 3.4's shapes.

Shapes were recorded from a real etcd 3.4.23 with the same requests (comments quote it);
``test_shapes_match_a_real_etcd`` compares the key sets live when etcd is installed.
"""

from __future__ import annotations

import pytest

from kvserver.kvpb.service_errors import no_leader
from kvserver.membership.reconfig import (
    MSG_BAD_URLS,
    MSG_LEARNER_NOT_READY,
    MSG_MEMBER_NOT_FOUND,
    MSG_NOT_ENOUGH_STARTED,
    MSG_NOT_LEARNER,
    MSG_PEER_URL_EXIST,
    MSG_TOO_MANY_LEARNERS,
)

from .fakes import DEFAULT_CLUSTER_ID, DEFAULT_MEMBER_ID
from .helpers import serve

CID, MID = str(DEFAULT_CLUSTER_ID), str(DEFAULT_MEMBER_ID)
HDR = {"cluster_id": CID, "member_id": MID, "raft_term": "2"}
SELF = {
    "ID": MID,
    "name": "local",
    "peerURLs": ["http://127.0.0.1:2380"],
    "clientURLs": ["http://127.0.0.1:2379"],
}


async def test_list_shape() -> None:
    # etcd: {"header":{"cluster_id","member_id","raft_term"},"members":[{"ID","name",
    #   "peerURLs","clientURLs"}]} -- no revision, no isLearner on a voter
    async with serve() as api:
        for body in (None, {}, {"linearizable": True}):
            status, got = await api.post("/v3/cluster/member/list", body)
            assert status == 200
            assert got == {"header": HDR, "members": [SELF]}
        status, got = await api.post("/v3beta/cluster/member/list", {})
        assert status == 200 and got["members"] == [SELF]


async def test_add_learner_promote_remove() -> None:
    async with serve() as api:
        status, got = await api.post(
            "/v3/cluster/member/add", {"peerURLs": ["http://127.0.0.1:1"], "isLearner": True}
        )
        # etcd: {"header":...,"member":{"ID","peerURLs","isLearner":true},"members":[...]}
        assert status == 200 and list(got) == ["header", "member", "members"]
        new = got["member"]
        assert set(new) == {"ID", "peerURLs", "isLearner"}
        assert new["peerURLs"] == ["http://127.0.0.1:1"] and new["isLearner"] is True
        assert int(new["ID"]) > 0
        assert sorted(got["members"], key=lambda m: int(m["ID"])) == sorted(
            [SELF, new], key=lambda m: int(m["ID"])
        )

        status, got = await api.post("/v3/cluster/member/promote", {"ID": new["ID"]})
        assert status == 200 and list(got) == ["header", "members"]
        promoted = next(m for m in got["members"] if m["ID"] == new["ID"])
        assert "isLearner" not in promoted

        status, got = await api.post("/v3/cluster/member/remove", {"ID": int(new["ID"])})
        assert status == 200 and got == {"header": HDR, "members": [SELF]}
        # removed for good: its ID cannot be removed or promoted again
        for path in ("remove", "promote"):
            status, got = await api.post(f"/v3/cluster/member/{path}", {"ID": new["ID"]})
            assert status == 404 and got == {
                "error": MSG_MEMBER_NOT_FOUND,
                "message": MSG_MEMBER_NOT_FOUND,
                "code": 5,
            }


@pytest.mark.parametrize(
    "body, code, status, message",
    [
        ({}, 3, 400, MSG_BAD_URLS),
        ({"peerURLs": []}, 3, 400, MSG_BAD_URLS),
        ({"peerURLs": ["bad"]}, 3, 400, MSG_BAD_URLS),
        ({"peerURLs": ["http://127.0.0.1:2380"]}, 9, 412, MSG_PEER_URL_EXIST),
        ({"peerURLs": "x"}, 3, 400, 'raftkv: field "peerURLs": expected an array of strings'),
        (
            {"peerURLs": ["http://127.0.0.1:5"], "isLearner": "yes"},
            3,
            400,
            'raftkv: field "isLearner": expected true or false',
        ),
    ],
)
async def test_add_errors(body, code, status, message) -> None:
    async with serve() as api:
        got_status, got = await api.post("/v3/cluster/member/add", body)
        assert (got_status, got) == (status, {"error": message, "message": message, "code": code})
        assert len(api.service.membership.registry.list()) == 1  # nothing changed


async def test_too_many_learners_and_promote_errors() -> None:
    async with serve() as api:
        svc = api.service
        learner = (await svc.member_add(["http://127.0.0.1:1"], True)).member
        status, got = await api.post(
            "/v3/cluster/member/add", {"peerURLs": ["http://127.0.0.1:9"], "isLearner": True}
        )
        assert status == 412 and got["error"] == MSG_TOO_MANY_LEARNERS and got["code"] == 9
        svc.membership.unsynced.add(learner.id)
        status, got = await api.post("/v3/cluster/member/promote", {"ID": str(learner.id)})
        assert status == 412 and got["error"] == MSG_LEARNER_NOT_READY
        status, got = await api.post("/v3/cluster/member/promote", {"ID": MID})
        assert status == 412 and got["error"] == MSG_NOT_LEARNER


async def test_quorum_of_started_members() -> None:
    async with serve() as api:
        # one started member: growing to two is allowed (etcd's special case) ...
        status, _ = await api.post("/v3/cluster/member/add", {"peerURLs": ["http://h:1"]})
        assert status == 200
        # ... but a third voter would make 1 started of 3
        status, got = await api.post("/v3/cluster/member/add", {"peerURLs": ["http://h:2"]})
        assert (status, got["code"], got["error"]) == (500, 2, MSG_NOT_ENOUGH_STARTED)
        # removing the only started member leaves none started
        status, got = await api.post("/v3/cluster/member/remove", {"ID": MID})
        assert (status, got["error"]) == (500, MSG_NOT_ENOUGH_STARTED)


@pytest.mark.parametrize(
    "path, body",
    [
        ("remove", {"ID": "abc"}),
        ("remove", {"ID": -1}),
        ("promote", {"ID": 1.5}),
        ("remove", []),
        ("list", [1]),
        ("update", {"ID": MID, "peerURLs": [1]}),
    ],
)
async def test_bad_input_is_400(path, body) -> None:
    async with serve() as api:
        status, got = await api.post(f"/v3/cluster/member/{path}", body)
        assert status == 400 and got["code"] == 3 and got["error"].startswith("raftkv: ")


async def test_missing_id_is_not_found_and_bad_json_400() -> None:
    async with serve() as api:
        status, got = await api.post("/v3/cluster/member/remove", {})  # etcd: ID 0
        assert status == 404 and got["error"] == MSG_MEMBER_NOT_FOUND
        status, got = await api.post("/v3/cluster/member/remove", raw="{")
        assert status == 400 and got["code"] == 3


async def test_update_peer_urls() -> None:
    async with serve() as api:
        new = (await api.service.member_add(["http://127.0.0.1:1"], True)).member
        status, got = await api.post(
            "/v3/cluster/member/update", {"ID": str(new.id), "peerURLs": ["http://127.0.0.1:7"]}
        )
        assert status == 200
        assert next(m for m in got["members"] if m["ID"] == str(new.id))["peerURLs"] == [
            "http://127.0.0.1:7"
        ]
        status, got = await api.post(
            "/v3/cluster/member/update", {"ID": str(new.id), "peerURLs": ["http://127.0.0.1:2380"]}
        )
        assert status == 412 and got["error"] == MSG_PEER_URL_EXIST


async def test_no_leader_is_503_and_get_is_405() -> None:
    async with serve() as api:
        api.service.fail_with = no_leader()
        status, got = await api.post("/v3/cluster/member/add", {"peerURLs": ["http://h:1"]})
        assert status == 503 and got["error"] == "etcdserver: no leader"
        api.service.fail_with = None
        status, _, _ = await api.request("GET", "/v3/cluster/member/list")
        assert status == 405


@pytest.mark.slow
@pytest.mark.external
async def test_shapes_match_a_real_etcd(tmp_path) -> None:
    """The same requests against etcd 3.4: the same keys (values differ: IDs, URLs)."""
    import json
    import urllib.error
    import urllib.request

    from tests.etcd_process import etcd_process

    def post(url, path, body):
        req = urllib.request.Request(
            url + path, data=json.dumps(body).encode(), headers={"Content-Type": "application/json"}
        )
        try:
            with urllib.request.urlopen(req, timeout=10) as resp:
                return resp.status, json.load(resp)
        except urllib.error.HTTPError as exc:
            return exc.code, json.load(exc)

    def shape(doc):
        if isinstance(doc, dict):
            return {k: shape(v) for k, v in doc.items() if k not in ("ID",)}
        if isinstance(doc, list):
            return sorted({json.dumps(shape(v), sort_keys=True) for v in doc})
        return type(doc).__name__

    steps = [
        ("list", {}),
        ("add", {"peerURLs": ["http://127.0.0.1:1"], "isLearner": True}),
        ("add", {"peerURLs": ["http://127.0.0.1:1"], "isLearner": True}),
        ("remove", {"ID": "1"}),
        ("promote", {"ID": "1"}),
        ("add", {"peerURLs": []}),
    ]

    with etcd_process(str(tmp_path)) as etcd:
        theirs = [post(etcd.url, f"/v3/cluster/member/{p}", b) for p, b in steps]

    async with serve() as api:
        mine = [await api.post(f"/v3/cluster/member/{p}", b) for p, b in steps]
    for (p, _), (s1, d1), (s2, d2) in zip(steps, theirs, mine, strict=True):
        assert shape(d1) == shape(d2), p
        assert s1 == s2, p
