"""``raftkv user|role|auth`` and ``--user`` on the client commands, end to end against the
real client API with auth (in process, ``AuthServed``): etcdctl's argument shapes, the human
and JSON output, refusals that change nothing, and the password prompt rules."""

from __future__ import annotations

import io
import json

import pytest

from kvserver.cli import client as cli_client
from kvserver.cli import main

from .helpers import AuthServed


@pytest.fixture
def served():
    s = AuthServed().start()
    yield s
    s.close()


class NotATty(io.StringIO):
    def isatty(self) -> bool:
        return False


class Tty(io.StringIO):
    def isatty(self) -> bool:
        return True


def run(served, capsys, *argv: str) -> tuple[int, str, str]:
    capsys.readouterr()
    code = main([*argv, "--endpoints", served.url, "--timeout", "5"])
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def ok(served, capsys, *argv: str) -> str:
    code, out, err = run(served, capsys, *argv)
    assert code == 0, (argv, out, err)
    return out


def setup_cli(served, capsys) -> None:
    assert ok(served, capsys, "user", "add", "root:rootpw") == "User root created\n"
    ok(served, capsys, "user", "grant-role", "root", "root")
    assert ok(served, capsys, "role", "add", "app") == "Role app created\n"
    assert (
        ok(served, capsys, "role", "grant-permission", "app", "readwrite", "a/", "--prefix")
        == "Role app updated\n"
    )
    ok(served, capsys, "role", "grant-permission", "app", "read", "cfg/x")
    ok(served, capsys, "user", "add", "alice", "--new-user-password", "alicepw")
    assert (
        ok(served, capsys, "user", "grant-role", "alice", "app")
        == "Role app is granted to user alice\n"
    )
    assert ok(served, capsys, "auth", "enable") == "Authentication Enabled\n"


def test_user_role_auth_commands_end_to_end(served, capsys, monkeypatch):
    monkeypatch.setattr("sys.stdin", NotATty())
    setup_cli(served, capsys)
    alice, root = ("--user", "alice:alicepw"), ("--user", "root:rootpw")
    assert ok(served, capsys, "put", "a/1", "x", *alice).startswith("OK")
    assert "x" in ok(served, capsys, "get", "a/1", "--user", "alice", "--password", "alicepw")
    code, out, err = run(served, capsys, "put", "b/1", "x", *alice)
    assert code == 1 and "permission denied" in err and out == ""
    code, _, err = run(served, capsys, "put", "cfg/x", "y", *alice)  # read only
    assert code == 1 and "permission denied" in err
    code, _, err = run(served, capsys, "get", "a/1")
    assert code == 1 and "user name is empty" in err
    code, _, err = run(served, capsys, "user", "list", *alice)  # not root
    assert code == 1 and "permission denied" in err
    assert served.kv.store.revision == 2  # only alice's put applied

    out = ok(served, capsys, "role", "get", "app", *root)
    assert out.startswith("Role app\n") and "READWRITE" in out and "(prefix a/)" in out
    assert "cfg/x" in out
    doc = json.loads(ok(served, capsys, "role", "get", "app", "--json", *root))
    assert {"permType": "READWRITE", "key": "YS8=", "range_end": "YTA="} in doc["perm"]
    assert ok(served, capsys, "user", "list", *root) == "alice\nroot\n"
    # as etcd: the root role exists implicitly and is listed once added
    assert json.loads(ok(served, capsys, "role", "list", "--json", *root))["roles"] == ["app"]
    out = ok(served, capsys, "user", "get", "alice", "--detail", *root)
    assert out.startswith("User: alice\nRoles: app\n") and "(prefix a/)" in out
    assert ok(served, capsys, "auth", "status", *root).startswith("Authentication Status: true")

    # a wrong password: etcd's error, nothing done
    code, _, err = run(served, capsys, "put", "a/2", "x", "--user", "alice:wrong")
    assert code == 1 and "authentication failed" in err

    out = ok(served, capsys, "role", "revoke-permission", "app", "a/", "--prefix", *root)
    assert out == "Permission of range [a/, a0) (prefix a/) is revoked from role app\n"
    code, _, err = run(served, capsys, "put", "a/1", "y", *alice)
    assert code == 1 and "permission denied" in err
    ok(served, capsys, "user", "passwd", "alice", "--new-user-password", "newpw", *root)
    code, _, err = run(served, capsys, "get", "cfg/x", *alice)
    assert code == 1 and "authentication failed" in err
    code, _, err = run(served, capsys, "get", "cfg/x", "--user", "alice:newpw")
    assert code == 1 and "not found" in err  # read still granted: the key just is not there
    assert (
        ok(served, capsys, "user", "revoke-role", "alice", "app", *root)
        == "Role app is revoked from user alice\n"
    )
    assert ok(served, capsys, "user", "delete", "alice", *root) == "User alice deleted\n"
    assert ok(served, capsys, "role", "delete", "app", *root) == "Role app deleted\n"
    assert ok(served, capsys, "auth", "disable", *root) == "Authentication Disabled\n"
    assert (
        ok(served, capsys, "auth", "status") == "Authentication Status: false\n"
        "AuthRevision: " + str(served.kv.auth.store.revision) + "\n"
    )
    assert served.kv.store.revision == 2


def test_enable_without_root_is_refused(served, capsys):
    code, _, err = run(served, capsys, "auth", "enable")
    assert code == 1 and "etcdserver: root user does not exist" in err
    assert not served.kv.auth.enabled


def test_missing_password_without_a_terminal_is_a_clear_error(served, capsys, monkeypatch):
    monkeypatch.setattr("sys.stdin", NotATty())
    code, _, err = run(served, capsys, "get", "k", "--user", "alice")
    assert code == 1 and "no password" in err and "stdin is not a terminal" in err
    code, _, err = run(served, capsys, "user", "add", "bob")
    assert code == 1 and "no password for user bob" in err
    assert served.authentications == 0 and served.kv.auth.users() == []


def test_missing_password_is_asked_on_a_terminal(served, capsys, monkeypatch):
    monkeypatch.setattr("sys.stdin", NotATty())
    setup_cli(served, capsys)
    asked: list[str] = []
    monkeypatch.setattr("sys.stdin", Tty())
    monkeypatch.setattr("getpass.getpass", lambda prompt: asked.append(prompt) or "alicepw")
    # the default argument of auth_options_from was bound at import: patch it there too
    monkeypatch.setattr(
        cli_client.auth_options_from,
        "__defaults__",
        (cli_client.os.environ, None, lambda p: asked.append(p) or "alicepw"),
    )
    assert ok(served, capsys, "put", "a/1", "x", "--user", "alice").startswith("OK")
    assert asked == ["Password for alice: "]
    ok(served, capsys, "user", "add", "carol", "--user", "root:rootpw")  # asked twice
    assert asked[1:] == ["Password of carol: ", "Type password again for confirmation: "]
    assert "carol" in served.kv.auth.users()


def test_range_arguments_are_checked(served, capsys):
    code, _, err = run(
        served, capsys, "role", "grant-permission", "r", "readwrite", "a", "b", "--prefix"
    )
    assert code == 1 and "not both" in err
    with pytest.raises(SystemExit):
        main(["role", "grant-permission", "r", "everything", "a"])
