"""``Client.key_ranks`` (raftkv's ``POST /v1/ranks``) and ``Client.range_arrow`` against the
real HTTP API over an in-memory store.

- ranks: the keys at given ranks and the count, exact at the current revision; an older
  revision is answered at the current one with ``exact`` false; a compacted or future
  revision fails as a range does; bad input is refused;
- range_arrow: the same rows, header, ``more`` and ``count`` as ``range``, page by page.
"""

from __future__ import annotations

import pytest

pytest.importorskip("pyarrow")

from kvserver.client import (  # noqa: E402
    Client,
    CompactedError,
    FutureRevisionError,
    InvalidArgumentError,
    Op,
    Txn,
)
from tests.client.servers import Served  # noqa: E402

N = 1500


@pytest.fixture(scope="module")
def served():
    s = Served().start()
    try:
        with Client([s.url]) as c:
            for i in range(0, N, 100):
                c.txn(
                    Txn().then(*(Op.put(f"r/{j:05d}", b"v" * (j % 9)) for j in range(i, i + 100)))
                )
            c.put("other", "x")
        yield s
    finally:
        s.close()


@pytest.fixture
def client(served):
    with Client([served.url]) as c:
        yield c


def test_ranks_are_the_keys_at_those_positions(client) -> None:
    got = client.key_ranks("r/", prefix=True, ranks=[0, 1, 749, N - 1, N, 10 * N])
    assert got.count == N and got.exact
    assert got.keys == (b"r/00000", b"r/00001", b"r/00749", b"r/%05d" % (N - 1), None, None)
    assert got.revision == client.range("r/", prefix=True, limit=1).revision


def test_ranks_of_a_half_open_range_and_of_every_key(client) -> None:
    got = client.key_ranks("r/00100", "r/00200", ranks=[0, 99, 100])
    assert (got.count, got.keys) == (100, (b"r/00100", b"r/00199", None))
    everything = client.key_ranks("", prefix=True, ranks=[0, N])
    assert everything.count == N + 1
    assert everything.keys == (b"other", b"r/%05d" % (N - 1))
    one = client.key_ranks("r/00007", ranks=[0, 1])
    assert (one.count, one.keys) == (1, (b"r/00007", None))


def test_an_older_revision_is_answered_at_the_current_one_not_exactly(client) -> None:
    now = client.range("r/", prefix=True, limit=1).revision
    got = client.key_ranks("r/", prefix=True, ranks=[3], revision=2)
    assert not got.exact
    assert got.revision == now and got.count == N and got.keys == (b"r/00003",)


def test_a_future_or_compacted_revision_fails_as_a_range_does(served) -> None:
    with Client([served.url]) as c:
        now = c.range("r/", prefix=True, limit=1).revision
        with pytest.raises(FutureRevisionError):
            c.key_ranks("r/", prefix=True, ranks=[0], revision=now + 10)
        c.put("later", "1")
        c.compact(now)
        with pytest.raises(CompactedError):
            c.key_ranks("r/", prefix=True, ranks=[0], revision=now - 1)
        assert c.key_ranks("r/", prefix=True, ranks=[0], revision=now).count == N


def test_bad_ranks_are_refused(client) -> None:
    with pytest.raises(ValueError):
        client.key_ranks("r/", prefix=True, ranks=[-1])
    with pytest.raises(ValueError):
        client.key_ranks("r/", prefix=True, ranks=list(range(5000)))


def test_the_server_refuses_what_the_client_would_not_send(served) -> None:
    import json
    import urllib.error
    import urllib.request

    for body in ({"key": "cg==", "ranks": ["-1"]}, {"ranks": []}, {"key": "cg==", "x": 1}):
        req = urllib.request.Request(
            served.url + "/v1/ranks", data=json.dumps(body).encode(), method="POST"
        )
        with pytest.raises(urllib.error.HTTPError) as info:
            urllib.request.urlopen(req, timeout=10)
        assert info.value.code == 400


def test_range_arrow_pages_equal_range_pages(client) -> None:
    start = b"r/"
    rows = 0
    while True:
        page = client.range_arrow(start, b"r0", limit=400)
        plain = client.range(start, b"r0", limit=400)
        assert (page.more, page.count, page.revision) == (plain.more, plain.count, plain.revision)
        assert page.batch.column("key").to_pylist() == [kv.key.decode() for kv in plain.kvs]
        assert page.batch.column("value").to_pylist() == [kv.value for kv in plain.kvs]
        assert page.batch.column("mod_revision").to_pylist() == [
            kv.mod_revision for kv in plain.kvs
        ]
        rows += page.batch.num_rows
        if not page.more:
            break
        start = page.last_key() + b"\0"
    assert rows == N


def test_range_arrow_refuses_like_range(client) -> None:
    with pytest.raises(InvalidArgumentError):
        client.range_arrow("")
