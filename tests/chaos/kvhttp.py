"""The few etcd-gateway requests the chaos workloads make, over plain urllib.

Plain HTTP on purpose (as tests/cluster/harness): a bug in the client library must neither
hide nor cause a failure here. Every request has a timeout. :func:`request` returns
``(status, body)`` for any HTTP answer and raises :class:`NoAnswer` when there was none
(refused, reset, timed out, truncated): the caller records such an operation as *unknown*,
since the server may still apply it.
"""

from __future__ import annotations

import base64
import http.client
import json
import urllib.error
import urllib.request

PREFIX = "chaos/"


class NoAnswer(Exception):
    """No complete HTTP answer: the request may or may not have taken effect."""


def b64(data: str | bytes) -> str:
    return base64.b64encode(data.encode() if isinstance(data, str) else data).decode()


def unb64(data: str | None) -> str:
    return base64.b64decode(data or "").decode()


def prefix_end(prefix: str) -> str:
    return prefix[:-1] + chr(ord(prefix[-1]) + 1)


def request(url: str, path: str, body: dict, timeout_s: float) -> tuple[int, dict]:
    data = json.dumps(body).encode()
    req = urllib.request.Request(
        url + path, data=data, method="POST", headers={"Content-Type": "application/json"}
    )
    try:
        with urllib.request.urlopen(req, timeout=timeout_s) as resp:
            raw = resp.read()
            status = resp.status
    except urllib.error.HTTPError as exc:
        try:
            raw, status = exc.read(), exc.code
        except Exception as inner:  # noqa: BLE001 - body cut off
            raise NoAnswer(f"{path}: {exc.code} with a truncated body ({inner})") from None
    except (OSError, http.client.HTTPException) as exc:
        raise NoAnswer(f"{path} via {url}: {type(exc).__name__}: {exc}") from None
    try:
        return status, json.loads(
            raw.splitlines()[0] if raw.startswith(b'{"result"') else raw or b"{}"
        )
    except ValueError:
        raise NoAnswer(f"{path}: {status} with a body that is not JSON: {raw[:200]!r}") from None


def revision_of(body: dict) -> int:
    return int(body.get("header", {}).get("revision", 0))


def put(url: str, key: str, value: str, timeout_s: float, lease: int = 0) -> tuple[int, dict]:
    body = {"key": b64(key), "value": b64(value)}
    if lease:
        body["lease"] = str(lease)
    return request(url, "/v3/kv/put", body, timeout_s)


def get(url: str, key: str, timeout_s: float, serializable: bool = False) -> tuple[int, dict]:
    return request(url, "/v3/kv/range", {"key": b64(key), "serializable": serializable}, timeout_s)


def get_prefix(
    url: str, prefix: str, timeout_s: float, serializable: bool = False
) -> tuple[int, dict]:
    return request(
        url,
        "/v3/kv/range",
        {"key": b64(prefix), "range_end": b64(prefix_end(prefix)), "serializable": serializable},
        timeout_s,
    )


def kvs(body: dict) -> list[dict]:
    """``kvs`` of a range answer, decoded: key, value, create/mod revision, version, lease."""
    return [
        {
            "key": unb64(kv.get("key")),
            "value": unb64(kv.get("value")),
            "create_revision": int(kv.get("create_revision", 0)),
            "mod_revision": int(kv.get("mod_revision", 0)),
            "version": int(kv.get("version", 0)),
            "lease": int(kv.get("lease", 0)),
        }
        for kv in body.get("kvs", [])
    ]


def compare(key: str, target: str, value: int | str, result: str = "EQUAL") -> dict:
    field = {
        "CREATE": "create_revision",
        "MOD": "mod_revision",
        "VERSION": "version",
        "VALUE": "value",
        "LEASE": "lease",
    }[target]
    return {
        "key": b64(key),
        "target": target,
        "result": result,
        field: b64(value) if target == "VALUE" else str(value),
    }


def put_op(key: str, value: str, lease: int = 0) -> dict:
    op = {"key": b64(key), "value": b64(value)}
    if lease:
        op["lease"] = str(lease)
    return {"request_put": op}


def txn(
    url: str,
    compares: list[dict],
    success: list[dict],
    timeout_s: float,
    failure: list[dict] | None = None,
) -> tuple[int, dict]:
    return request(
        url,
        "/v3/kv/txn",
        {"compare": compares, "success": success, "failure": failure or []},
        timeout_s,
    )
