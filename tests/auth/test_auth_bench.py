"""``raftkv bench --user``: one token for the run, on every request (and watch) of every
client; without it, or with a wrong password, nothing is written. In process, counts only."""

from __future__ import annotations

import json

import pytest

from kvserver import cli
from kvserver.client import Client
from tests.client.fakeserver import FAST

from .helpers import AuthServed


@pytest.fixture
def served():
    s = AuthServed().start()
    with Client(s.url, **FAST) as c:
        for op, body in (
            ("user/add", {"name": "root", "password": "rootpw"}),
            ("user/grant", {"user": "root", "role": "root"}),
            ("role/add", {"name": "digits"}),
            (
                "role/grant",
                {
                    "name": "digits",
                    "perm": {
                        "permType": "READWRITE",
                        "key": "MDAwMA==",  # "0000"
                        "range_end": "MDAwMQ==",
                    },
                },
            ),  # "0001"
            ("user/add", {"name": "bench", "password": "benchpw"}),
            ("user/grant", {"user": "bench", "role": "digits"}),
            ("enable", {}),
        ):
            c.auth_request(op, body)
    yield s
    s.close()


def bench(capsys, served, *argv):
    capsys.readouterr()
    code = cli.main(["bench", *argv, "--json", "--endpoints", served.url, "--key-space-size", "20"])
    captured = capsys.readouterr()
    return code, json.loads(captured.out) if captured.out else None, captured.err


def test_bench_with_user_writes_and_without_is_refused(capsys, served):
    before = served.kv.store.revision
    code, doc, err = bench(
        capsys, served, "put", "--total", "60", "--clients", "4", "--user", "bench:benchpw"
    )
    assert code == 0, err
    assert (doc["count"], doc["errors"]) == (60, 0)
    assert served.kv.store.revision == before + 60 and served.authentications == 1
    code, doc, _ = bench(capsys, served, "put", "--total", "20", "--clients", "2")
    assert code == 1 and doc["errors"] == 20
    code, doc, err = bench(capsys, served, "put", "--total", "20", "--user", "bench:wrong")
    assert code == 1 and doc is None and "authentication failed" in err
    assert served.kv.store.revision == before + 60
    code, doc, err = bench(
        capsys,
        served,
        "watch-latency",
        "--total",
        "10",
        "--watchers",
        "2",
        "--user",
        "bench:benchpw",
    )
    assert code == 0, err
    assert doc["count"] == 20 and doc["errors"] == 0  # every put seen by both watchers
