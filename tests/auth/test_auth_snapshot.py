"""Auth state in backups (in process): the maintenance snapshot image carries the auth frame
(users, roles, permissions, enabled; never tokens), ``check_image`` accepts and verifies it,
a member restored from it has the same auth state, and the archiver reads the revision of a
raft snapshot that has the frame."""

from __future__ import annotations

import types

import pytest

import raftpb
from kvserver.api.http.maintenance import capture
from kvserver.archive.archiver import snapshot_revision
from kvserver.archive.backup import check_image
from kvserver.archive.store import ArchiveError
from kvserver.auth import passwords
from kvserver.auth.perms import Permission, PermType
from kvserver.auth.store import (
    AUTH_FRAME_MAGIC,
    AuthEnable,
    Authenticate,
    RoleAdd,
    RoleGrantPermission,
    UserAdd,
    UserGrantRole,
    encode_auth_entry,
)
from kvserver.auth.tokens import token_digest
from kvserver.kvpb.kv import PutRequest
from kvserver.membership.registry import frame_members
from kvserver.server.replicated_kv import RaftKV
from tests.support.apply_now import raftkv_without_raft


def member() -> RaftKV:
    return raftkv_without_raft(cluster_id=7, member_id=1, name="m1", members=())


def with_auth() -> RaftKV:
    kv = member()
    kv.store.apply(PutRequest(b"a/1", b"v"))
    entries = [
        UserAdd("root", passwords.hash_password("rootpw", n=16)),
        UserGrantRole("root", "root"),
        RoleAdd("app"),
        RoleGrantPermission("app", Permission(PermType.READWRITE, b"a/", b"a0")),
        UserAdd("alice", passwords.hash_password("alicepw", n=16)),
        UserGrantRole("alice", "app"),
        AuthEnable(),
    ]
    for index, req in enumerate(entries, start=2):
        result = kv.apply(index, encode_auth_entry(req))
        assert not isinstance(result, Exception), (req, result)
    checked = Authenticate("alice", token_digest("alice-token"), kv.auth.store.revision)
    assert not isinstance(kv.apply(len(entries) + 2, encode_auth_entry(checked)), Exception)
    assert kv.auth.tokens.user_of("alice-token") == "alice"
    return kv


def image_of(kv: RaftKV) -> bytes:
    service = types.SimpleNamespace(
        store=kv.store,
        lessor=kv.lessor,
        auth=kv.auth,
        node=types.SimpleNamespace(applied=9, term=2),
        cluster_id=kv.cluster_id,
        member_id=kv.member_id,
    )
    _, chunks = capture(service)
    return b"".join(chunks)


def test_backup_image_carries_auth_and_a_restored_member_enforces_it():
    kv = with_auth()
    image = image_of(kv)
    assert image.startswith(AUTH_FRAME_MAGIC)
    assert b"alice-token" not in image and b"alicepw" not in image
    check_image(image)
    restored = member()
    restored.restore(image)
    auth = restored.auth
    assert auth.enabled and auth.users() == ["alice", "root"] and auth.roles() == ["app"]
    assert auth.role_perms("app") == (Permission(PermType.READWRITE, b"a/", b"a0"),)
    assert auth.store.revision == kv.auth.store.revision
    assert auth.tokens.user_of("alice-token") is None  # tokens are not in backups
    assert auth.can_read("alice", b"a/1") and not auth.can_read("alice", b"b")
    assert passwords.verify("alicepw", auth.store.users["alice"].password_hash, n=16)
    assert restored.store.revision == kv.store.revision


def test_image_without_auth_is_unchanged_and_a_broken_frame_is_refused():
    kv = member()
    kv.store.apply(PutRequest(b"k", b"v"))
    image = image_of(kv)
    assert not image.startswith(AUTH_FRAME_MAGIC)  # auth never used: the older layout
    check_image(image)
    broken = image_of(with_auth())
    with pytest.raises(ArchiveError, match="does not decode"):
        check_image(broken[: len(AUTH_FRAME_MAGIC) + 6])
    with pytest.raises(ArchiveError, match="does not decode"):
        check_image(broken[: len(AUTH_FRAME_MAGIC) + 4] + b"\xff" * 64)


def test_archiver_reads_the_revision_of_a_raft_snapshot_with_auth():
    kv = with_auth()
    data = frame_members(b"") + b"".join(kv.snapshot_chunks())
    snapshot = raftpb.Snapshot(data, raftpb.SnapshotMetadata(raftpb.ConfState(voters=(1,)), 9, 2))
    assert snapshot_revision(snapshot) == kv.store.revision == 2
