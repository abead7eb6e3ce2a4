"""``raftkv put|get|del|status`` (kvserver.cli.client) against the fake cluster.

Pinned down: etcdctl-like tables by default and one JSON document with ``--json``; exit status
0 on success, 1 on a failure with a one-line ``Error: ...`` on stderr and no traceback, 2 on
bad usage; ``--endpoints`` falls back to ``$RAFTKV_ENDPOINTS``.
"""

import argparse
import io
import json

import pytest

from kvserver.cli import client as cli_client
from tests.client.fakeserver import Fail, dead_url


def cli(capsys, *argv):
    status = cli_client.main(list(argv))
    out, err = capsys.readouterr()
    return status, out, err


def test_put_then_get_table(cluster, capsys):
    ep = f"--endpoints={','.join(cluster.urls)}"
    assert cli(capsys, "put", "greeting", "hello world", ep) == (0, "OK (revision 2)\n", "")
    status, out, err = cli(capsys, "get", "greeting", ep)
    assert status == 0 and err == ""
    assert out == (
        "+----------+-------------+------------+---------+---------+-------+\n"
        "| KEY      | VALUE       | CREATE REV | MOD REV | VERSION | LEASE |\n"
        "+----------+-------------+------------+---------+---------+-------+\n"
        "| greeting | hello world | 2          | 2       | 1       | 0     |\n"
        "+----------+-------------+------------+---------+---------+-------+\n"
        "1 key, revision 2\n"
    )


def test_put_prev_kv_and_lease(cluster, capsys):
    ep = f"--endpoints={cluster.urls[0]}"
    cli(capsys, "put", "k", "v1", ep)
    status, out, _ = cli(capsys, "put", "k", "v2", "--prev-kv", "--lease", "0x10", ep)
    assert status == 0
    assert out.startswith("OK (revision 3)\nprevious:\n")
    assert "| k   | v1    |" in out
    status, out, _ = cli(capsys, "get", "k", "--json", ep)
    assert json.loads(out)["kvs"][0]["lease"] == 16


def test_wide_characters_do_not_misalign_tables(cluster, capsys):
    ep = f"--endpoints={cluster.urls[0]}"
    cli(capsys, "put", "都市/東京", "晴れ", ep)
    cli(capsys, "put", "都市/paris", "cafe\u0301 ok", ep)  # a combining accent: no column
    status, out, _ = cli(capsys, "get", "都市/", "--prefix", ep)
    assert status == 0
    assert out == (
        "+------------+---------+------------+---------+---------+-------+\n"
        "| KEY        | VALUE   | CREATE REV | MOD REV | VERSION | LEASE |\n"
        "+------------+---------+------------+---------+---------+-------+\n"
        "| 都市/paris | cafe\u0301 ok | 3          | 3       | 1       | 0     |\n"
        "| 都市/東京  | 晴れ    | 2          | 2       | 1       | 0     |\n"
        "+------------+---------+------------+---------+---------+-------+\n"
        "2 keys, revision 3\n"
    )
    lines = out.splitlines()[:-1]
    assert len({cli_client.display_width(line) for line in lines}) == 1


@pytest.mark.parametrize(
    "text,width",
    [
        ("abc", 3),
        ("東京", 4),
        ("ｱ", 1),
        ("Ａ", 2),
        ("e\u0301", 1),
        ("\u200b", 0),
        ("", 0),
    ],
)
def test_display_width(text, width):
    assert cli_client.display_width(text) == width


def test_get_prefix_json_limit_keys_only(cluster, capsys):
    ep = f"--endpoints={cluster.urls[1]}"
    for k in ("jobs/1", "jobs/2", "jobs/3", "other"):
        cli(capsys, "put", k, f"value of {k}", ep)
    status, out, _ = cli(capsys, "get", "jobs/", "--prefix", "--limit", "2", "--json", ep)
    assert status == 0
    doc = json.loads(out)
    assert doc["count"] == 3 and doc["more"] is True and doc["revision"] == 5
    assert [kv["key"] for kv in doc["kvs"]] == ["jobs/1", "jobs/2"]
    assert doc["kvs"][0] == {
        "key": "jobs/1",
        "value": "value of jobs/1",
        "create_revision": 2,
        "mod_revision": 2,
        "version": 1,
        "lease": 0,
    }
    status, out, _ = cli(capsys, "get", "jobs/", "--prefix", "--keys-only", ep)
    assert status == 0 and "VALUE" not in out and "jobs/3" in out
    assert out.endswith("3 keys, revision 5\n")
    status, out, _ = cli(capsys, "get", "jobs/", "--prefix", "--limit", "1", ep)
    assert out.endswith("1 of 3 keys, revision 5\n")


def test_binary_values_are_escaped_in_tables_and_base64_in_json(cluster, capsys):
    ep = f"--endpoints={cluster.urls[0]}"
    # A non-UTF-8 argv byte arrives as a surrogate escape; the CLI sends the original byte.
    assert cli(capsys, "put", "bin", "\udcff\x01", ep)[0] == 0
    _, out, _ = cli(capsys, "get", "bin", ep)
    assert "| bin | \\xff\\x01 |" in out
    _, out, _ = cli(capsys, "get", "bin", "--json", ep)
    kv = json.loads(out)["kvs"][0]
    assert kv["encoding"] == "base64" and kv["value"] == "/wE=" and kv["key"] == "Ymlu"


def test_get_missing_key_exits_1(cluster, capsys):
    status, out, err = cli(capsys, "get", "nope", f"--endpoints={cluster.urls[0]}")
    assert status == 1 and out == ""
    assert err == "Error: key 'nope' not found (revision 1)\n"
    # A prefix that matches nothing is not an error.
    status, out, _ = cli(capsys, "get", "nope", "--prefix", f"--endpoints={cluster.urls[0]}")
    assert status == 0 and out == "(no keys; revision 1)\n"


def test_del_and_del_prefix(cluster, capsys):
    ep = f"--endpoints={cluster.urls[0]}"
    for k in ("a/1", "a/2", "b"):
        cli(capsys, "put", k, "x", ep)
    assert cli(capsys, "del", "a/", "--prefix", ep) == (0, "deleted 2 keys (revision 5)\n", "")
    assert cli(capsys, "del", "zzz", ep) == (0, "deleted 0 keys (revision 5)\n", "")
    status, out, _ = cli(capsys, "del", "b", "--json", ep)
    assert status == 0 and json.loads(out)["deleted"] == 1


def test_status_table_and_json(cluster, capsys):
    dead = dead_url()
    ep = f"--endpoints={','.join(cluster.urls + [dead])}"
    status, out, err = cli(capsys, "status", ep)
    assert status == 1  # one endpoint did not answer
    lines = out.splitlines()
    assert lines[1].split("|")[1:-1] == [
        " ENDPOINT               ",
        " ID   ",
        " IS LEADER ",
        " RAFT TERM ",
        " RAFT INDEX ",
        " APPLIED ",
        " REVISION ",
        " VERSION ",
        " DB SIZE ",
        " ERRORS                             ",
    ]
    rows = [[c.strip() for c in line.split("|")[1:-1]] for line in lines[3:7]]
    assert rows[0] == [
        cluster.urls[0],
        "1001",
        "true",
        "2",
        "10",
        "10",
        "1",
        "3.5.0",
        "24.6 kB",
        "",
    ]
    assert rows[1][:3] == [cluster.urls[1], "1002", "false"]
    assert rows[3][0] == dead and rows[3][-1] == "cannot connect: connection refused"
    assert err == f"Error: {dead}: cannot connect: connection refused\n"

    status, out, _ = cli(capsys, "status", "--json", f"--endpoints={','.join(cluster.urls)}")
    assert status == 0
    docs = json.loads(out)
    assert [d["is_leader"] for d in docs] == [True, False, False]
    assert docs[0]["member_id"] == 0x1001 and docs[0]["member_id_hex"] == "1001"
    assert docs[0]["raft_term"] == 2 and docs[0]["revision"] == 1


def test_unreachable_cluster_is_a_one_line_error(capsys):
    status, out, err = cli(capsys, "get", "k", f"--endpoints={dead_url()}", "--timeout", "0.3")
    assert status == 1 and out == ""
    assert err.startswith("Error: get 'k': could not reach any endpoint")
    assert "Traceback" not in err and err.count("\n") == 1


def test_server_error_is_a_one_line_error(cluster, capsys):
    cluster.nodes[0].script.append(
        Fail(400, 3, "etcdserver: request is too large", path="/v3/kv/put")
    )
    status, out, err = cli(capsys, "put", "k", "v", f"--endpoints={cluster.urls[0]}")
    assert status == 1 and out == ""
    assert err == "Error: put 'k': etcdserver: request is too large\n"


def test_endpoints_from_the_environment(cluster, capsys, monkeypatch):
    monkeypatch.setenv("RAFTKV_ENDPOINTS", cluster.urls[2])
    assert cli(capsys, "put", "k", "v")[0] == 0
    assert len(cluster.nodes[2].kv_requests()) + len(cluster.nodes[0].kv_requests()) == 1
    args = argparse.Namespace(endpoints=None)
    assert cli_client.endpoints_from(args, environ={}) == "http://127.0.0.1:2379"


def test_put_reads_the_value_from_stdin(cluster, capsys, monkeypatch):
    monkeypatch.setattr("sys.stdin", io.TextIOWrapper(io.BytesIO(b"line 1\nline 2\n")))
    assert cli(capsys, "put", "k", f"--endpoints={cluster.urls[0]}")[0] == 0
    _, out, _ = cli(capsys, "get", "k", "--json", f"--endpoints={cluster.urls[0]}")
    assert json.loads(out)["kvs"][0]["value"] == "line 1\nline 2\n"


@pytest.mark.parametrize(
    "argv",
    [
        ["get"],
        ["get", "k", "--limit", "-1"],
        ["put", "k", "v", "--lease", "xyz"],
        ["get", "k", "--timeout", "0"],
        ["status", "--bogus"],
    ],
)
def test_bad_usage_exits_2(argv, capsys):
    with pytest.raises(SystemExit) as e:
        cli_client.main(argv)
    assert e.value.code == 2


def test_bad_endpoint_is_an_error_not_a_traceback(capsys):
    status, _, err = cli(capsys, "get", "k", "--endpoints=ftp://x:1")
    assert status == 1 and err == "Error: bad endpoint 'ftp://x:1': want http://host:port\n"


def test_register_adds_the_four_commands():
    parser = argparse.ArgumentParser(prog="raftkv")
    sub = parser.add_subparsers(dest="command")
    cli_client.register(sub)
    assert set(sub.choices) == {"put", "get", "del", "status"}
    args = parser.parse_args(["get", "k", "--prefix", "--rev", "3", "--serializable"])
    assert args.func is cli_client.cmd_get and args.rev == 3 and args.serializable
