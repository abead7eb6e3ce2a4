"""Seeded random etcd v3 requests and how to compare two servers' answers to them.

``Generator(random.Random(seed))`` produces a sequence of requests in etcd's gateway JSON
form (``next()`` -> ``(path, body)``): puts, deletes, ranges with every option, txns with
every compare target and result (nested too), compactions at valid, compacted and future
revisions, lease calls with client-chosen IDs, and malformed requests (``bad``). It picks
revisions from the reference server's answers, which the caller passes to ``observe``.
``normalize(path, status, body)`` is what must be equal between etcd and raftkv;
``outcomes`` names what an answer exercised, and ``EXPECTED_OUTCOMES`` what a sequence
must have exercised, so that a generator bug cannot make a comparison vacuous. Used by the
gateway differential test (``tests/compat``) and the gRPC one (``tests/grpcapi``).
"""

from __future__ import annotations

import base64
import json
import random
from dataclasses import dataclass, field
from typing import Any

STEPS = 500
KEYS = ["a", "a/1", "a/2", "ab", "b", "b/x", "c", "d"]  # <= 12 keys: etcd sorts them stably
VALUES = ["", "v", "w", "xyz", "\u00e9", "0"]
LEASE_IDS = [101, 102, 103]
LEASE_TTL_S = 600  # nothing expires during a run


def b64(text: str) -> str:
    return base64.b64encode(text.encode()).decode()


def _next_key(key: str) -> str:
    return key[:-1] + chr(ord(key[-1]) + 1)


@dataclass
class Generator:
    """Random requests; ``rev``/``compact_rev`` follow etcd's answers (``observe``)."""

    rng: random.Random
    last_compaction: int = 0  # the revision of the last compaction request
    last_lease: int = 0  # the ID of the last lease request
    rev: int = 1
    compact_rev: int = 0
    granted: set[int] = field(default_factory=set)

    # --- pieces --------------------------------------------------------------------------

    def key(self) -> str:
        return self.rng.choice(KEYS)

    def key_range(self) -> dict[str, str]:
        r = self.rng.random()
        k = self.key()
        if r < 0.4:
            return {"key": b64(k)}
        if r < 0.6:
            return {"key": b64(k), "range_end": b64(_next_key(k))}  # prefix
        if r < 0.75:
            other = self.key()
            return {"key": b64(k), "range_end": b64(other)}  # maybe empty
        if r < 0.9:
            return {"key": b64(k), "range_end": b64("\0")}  # k and after
        return {"key": b64("\0"), "range_end": b64("\0")}  # everything

    def value(self) -> str:
        v = self.rng.choice(VALUES)
        return v + str(self.rng.randrange(3)) if self.rng.random() < 0.5 else v

    def revision(self) -> int:
        """A read revision: mostly valid, sometimes compacted or in the future."""
        r = self.rng.random()
        if r < 0.4:
            return 0
        if r < 0.8 and self.rev > self.compact_rev:
            return self.rng.randint(max(1, self.compact_rev), self.rev)
        if r < 0.9:
            return self.rev + self.rng.randint(1, 3)
        return max(0, self.compact_rev - self.rng.randint(1, 2))

    def maybe(self, p: float) -> bool:
        return self.rng.random() < p

    def lease(self) -> int:
        if self.granted and self.maybe(0.8):
            return self.rng.choice(sorted(self.granted))
        return self.rng.choice(LEASE_IDS + [999])

    # --- requests ------------------------------------------------------------------------

    def put(self) -> dict[str, Any]:
        body: dict[str, Any] = {"key": b64(self.key()), "value": b64(self.value())}
        if self.maybe(0.5):
            body["prev_kv"] = True
        if self.maybe(0.15):
            body["lease"] = str(self.lease())
        if self.maybe(0.05):
            body["ignore_value"] = True
            del body["value"]
        if self.maybe(0.05):
            body["ignore_lease"] = True
            body.pop("lease", None)
        return body

    def delete(self) -> dict[str, Any]:
        body: dict[str, Any] = self.key_range()
        if self.maybe(0.5):
            body["prev_kv"] = True
        return body

    def range(self) -> dict[str, Any]:
        body: dict[str, Any] = self.key_range()
        rng = self.rng
        if self.maybe(0.4):
            body["limit"] = rng.choice([1, 2, 3, "2", -1])
        if self.maybe(0.3):
            body["sort_order"] = rng.choice(["NONE", "ASCEND", "DESCEND", 1, 2])
        if self.maybe(0.3):
            body["sort_target"] = rng.choice(["KEY", "VERSION", "CREATE", "MOD", "VALUE", 3])
        if self.maybe(0.15):
            body["count_only"] = True
        if self.maybe(0.2):
            body["keys_only"] = True
        if self.maybe(0.3):
            body["revision"] = str(self.revision())
        for name in (
            "min_mod_revision",
            "max_mod_revision",
            "min_create_revision",
            "max_create_revision",
        ):
            if self.maybe(0.08):
                body[name] = rng.randint(0, self.rev + 1)
        if self.maybe(0.2):
            body["serializable"] = True
        return body

    def compare(self) -> dict[str, Any]:
        rng = self.rng
        target = rng.choice(["VERSION", "CREATE", "MOD", "VALUE", "LEASE"])
        c: dict[str, Any] = {
            "target": target,
            "result": rng.choice(["EQUAL", "GREATER", "LESS", "NOT_EQUAL"]),
        }
        c.update(self.key_range() if self.maybe(0.3) else {"key": b64(self.key())})
        if target == "VERSION":
            c["version"] = rng.randint(0, 3)
        elif target == "CREATE":
            c["create_revision"] = str(rng.randint(0, self.rev + 1))
        elif target == "MOD":
            c["mod_revision"] = rng.randint(0, self.rev + 1)
        elif target == "VALUE":
            c["value"] = b64(self.value())
        else:
            c["lease"] = rng.choice([0, *LEASE_IDS])
        return c

    def ops(self, depth: int) -> list[dict[str, Any]]:
        out: list[dict[str, Any]] = []
        written: set[str] = set()
        for _ in range(self.rng.randint(0, 3)):
            r = self.rng.random()
            if r < 0.35:
                out.append({"request_range": self.range() | {"serializable": False}})
            elif r < 0.7:
                put = self.put()
                if put["key"] in written and not self.maybe(0.1):
                    continue  # a duplicate write now and then: etcd refuses it
                written.add(put["key"])
                out.append({"request_put": put})
            elif r < 0.9:
                d = self.delete()
                if d.get("range_end") == b64("\0"):
                    continue  # known difference: see the module docstring
                if d["key"] in written and not self.maybe(0.2):
                    continue
                written.add(d["key"])
                out.append({"request_delete_range": d})
            elif depth < 2:
                out.append({"request_txn": self.txn(depth + 1)})
        return out

    def txn(self, depth: int = 0) -> dict[str, Any]:
        body: dict[str, Any] = {}
        compares = [self.compare() for _ in range(self.rng.randint(0, 3))]
        if compares:
            body["compare"] = compares
        success, failure = self.ops(depth), self.ops(depth)
        if success:
            body["success"] = success
        if failure:
            body["failure"] = failure
        return body

    def compaction(self) -> dict[str, Any]:
        r = self.rng.random()
        if r < 0.5 and self.rev > self.compact_rev + 1:
            rev = self.rng.randint(self.compact_rev + 1, self.rev)
        elif r < 0.7:
            rev = self.compact_rev  # already compacted
        elif r < 0.85:
            rev = self.rev + self.rng.randint(1, 5)  # future
        else:
            rev = max(0, self.compact_rev - 1)
        return {"revision": str(rev)}

    def bad(self) -> tuple[str, str]:
        k = b64(self.key())
        return self.rng.choice(
            [
                ("/v3/kv/put", json.dumps({"value": b64("x")})),  # no key
                ("/v3/kv/put", json.dumps({"key": "", "value": b64("x")})),
                ("/v3/kv/range", json.dumps({"key": ""})),
                ("/v3/kv/deleterange", json.dumps({})),
                ("/v3/kv/put", json.dumps({"key": "@@@"})),  # base64
                ("/v3/kv/put", json.dumps({"key": 5})),  # type
                ("/v3/kv/put", '{"key": '),  # JSON
                ("/v3/kv/range", json.dumps({"key": k, "limit": "x"})),
                ("/v3/kv/range", json.dumps({"key": k, "sort_order": "UP"})),
                ("/v3/kv/txn", json.dumps({"success": [{}]})),
                ("/v3/kv/txn", json.dumps({"compare": [{"target": "MOD", "result": "EQUAL"}]})),
                (
                    "/v3/kv/txn",
                    json.dumps(
                        {"success": [{"request_put": {"key": k}}, {"request_put": {"key": k}}]}
                    ),
                ),
                ("/v3/kv/txn", json.dumps({"success": [{"request_put": {"key": k}}] * 129})),
                ("/v3/kv/compaction", json.dumps({"revision": "-1"})),
                ("/v3/lease/grant", json.dumps({"TTL": "9000000001", "ID": 5})),
                ("/v3/lease/grant", json.dumps({"TTL": "abc"})),
                ("/v3/lease/revoke", json.dumps({"ID": 424242})),
                ("/v3/lease/revoke", json.dumps({})),
            ]
        )

    def lease_request(self) -> tuple[str, dict[str, Any]]:
        r = self.rng.random()
        if r < 0.35:
            return "/v3/lease/grant", {"ID": str(self.rng.choice(LEASE_IDS)), "TTL": LEASE_TTL_S}
        if r < 0.5:
            return "/v3/lease/revoke", {"ID": self.lease()}
        if r < 0.7:
            return "/v3/lease/timetolive", {"ID": self.lease(), "keys": self.maybe(0.7)}
        if r < 0.85:
            return "/v3/lease/keepalive", {"ID": self.lease()}
        return self.rng.choice(["/v3/lease/leases", "/v3/kv/lease/leases"]), {}

    def next(self) -> tuple[str, str]:
        r = self.rng.random()
        if r < 0.28:
            path, body = "/v3/kv/put", self.put()
        elif r < 0.38:
            path, body = "/v3/kv/deleterange", self.delete()
        elif r < 0.62:
            path, body = "/v3/kv/range", self.range()
        elif r < 0.8:
            path, body = "/v3/kv/txn", self.txn()
        elif r < 0.85:
            path, body = "/v3/kv/compaction", self.compaction()
        elif r < 0.94:
            path, body = self.lease_request()
        else:
            return self.bad()
        return path, json.dumps(body)

    def observe(self, path: str, status: int, body: Any) -> None:
        if status != 200 or not isinstance(body, dict):
            return
        rev = body.get("header", {}).get("revision")
        if rev is not None:
            self.rev = int(rev)
        if path == "/v3/kv/compaction":
            self.compact_rev = max(self.compact_rev, self.last_compaction)
        if path == "/v3/lease/grant":
            self.granted.add(int(body["ID"]))
        if path == "/v3/lease/revoke":
            self.granted.discard(self.last_lease)


def strip_header(obj: Any) -> Any:
    """Drop cluster_id/member_id/raft_term from every header (nested ones included)."""
    if isinstance(obj, dict):
        out = {}
        for k, v in obj.items():
            if k == "header" and isinstance(v, dict):
                out[k] = {hk: hv for hk, hv in v.items() if hk == "revision"}
            else:
                out[k] = strip_header(v)
        return out
    if isinstance(obj, list):
        return [strip_header(x) for x in obj]
    return obj


def normalize(path: str, status: int, body: Any) -> Any:
    if status != 200:
        if isinstance(body, dict) and "result" not in body:
            message = body.get("error", body.get("message", ""))
            return (
                status,
                body.get("code"),
                message if str(message).startswith("etcdserver:") else "",
            )
        return (status, body)
    body = strip_header(body)
    if path.endswith("/lease/keepalive") and isinstance(body, dict):
        # Only the leader renews: a member forwards the keepalive and answers with the
        # leader's revision, which may not yet include a write another member has applied
        # and acknowledged (the leader applies what it commits on its own time, as etcd's
        # does). The revision says nothing about the lease; what must agree is the rest.
        body.get("result", body).pop("header", None)
    if path.endswith("/lease/leases") and isinstance(body, dict) and "leases" in body:
        body["leases"] = sorted(body["leases"], key=lambda x: int(x["ID"]))
    if path.endswith("/lease/timetolive") and isinstance(body, dict) and "TTL" in body:
        ttl = int(body.pop("TTL"))
        granted = int(body.get("grantedTTL", ttl))
        # The remaining seconds depend on when each system received the request, which on a
        # loaded machine differs by more than a second boundary; no lease expires during a
        # run (LEASE_TTL_S), so what must agree is whether the lease is alive within its
        # granted TTL. Anything else (expired: -1, or more than granted) is compared exactly.
        body["TTL~"] = "alive" if 0 <= ttl <= granted else ttl
    if path.endswith("/lease/timetolive") and isinstance(body, dict) and "keys" in body:
        body["keys"] = sorted(body["keys"])  # etcd: Go map order (random); raftkv: sorted
    return (status, body)


EXPECTED_OUTCOMES = (
    "compaction ok",
    "compaction out-of-range",
    "range out-of-range",
    "range more",
    "txn succeeded",
    "txn failed",
    "put prev_kv",
    "delete deleted",
    "lease grant ok",
    "lease exists",
    "invalid-argument",
)


def outcomes(path: str, status: int, body: Any) -> list[str]:
    out = []
    kind = path.rsplit("/", 1)[-1]
    if status != 200:
        code = body.get("code") if isinstance(body, dict) else None
        if code == 11:
            out.append(f"{kind} out-of-range")
        elif code == 3:
            out.append("invalid-argument")
        elif code == 9:
            out.append("lease exists")
        return out
    if kind == "compaction":
        out.append("compaction ok")
    if kind == "range" and body.get("more"):
        out.append("range more")
    if kind == "txn":
        out.append("txn succeeded" if body.get("succeeded") else "txn failed")
    if kind == "put" and "prev_kv" in body:
        out.append("put prev_kv")
    if kind == "deleterange" and body.get("deleted"):
        out.append("delete deleted")
    if kind == "grant":
        out.append("lease grant ok")
    return out
