"""kvserver/etcdpb: the committed generated code is what ``make genproto`` makes, and the
contract it carries is etcd's.

- Regenerating from the .proto files with the same command (into a temporary directory)
  gives every committed ``*_pb2.py``, ``*_pb2.pyi`` and ``*_pb2_grpc.py`` byte for byte, and
  no other generated file: a .proto edited without ``make genproto`` fails here.
- The services list exactly etcd's RPCs, with etcd's method paths and streaming kinds, and
  the generated stubs call those paths.
- A few messages encode to the bytes etcd's field numbers give (the numbers that are not
  the next free one: Compare.range_end = 64, WatchResponse.events = 11) and decode back;
  JSON names are etcd's camelCase where etcd's field names are.
"""

from __future__ import annotations

import importlib.metadata
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

pytest.importorskip("grpc_tools")

from google.protobuf import json_format  # noqa: E402

from kvserver.etcdpb import auth_pb2, kv_pb2, lease_pb2, rpc_pb2, rpc_pb2_grpc  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = "kvserver/etcdpb"
GENERATED_SUFFIXES = ("_pb2.py", "_pb2.pyi", "_pb2_grpc.py")

# etcd 3.5's services: method -> (client streams, server streams).
UNARY, SERVER_STREAM, BIDI = (False, False), (False, True), (True, True)
ETCD_RPCS = {
    "KV": {
        "Range": UNARY,
        "Put": UNARY,
        "DeleteRange": UNARY,
        "Txn": UNARY,
        "Compact": UNARY,
    },
    "Watch": {"Watch": BIDI},
    "Lease": {
        "LeaseGrant": UNARY,
        "LeaseRevoke": UNARY,
        "LeaseKeepAlive": BIDI,
        "LeaseTimeToLive": UNARY,
        "LeaseLeases": UNARY,
    },
    "Cluster": {
        "MemberAdd": UNARY,
        "MemberRemove": UNARY,
        "MemberUpdate": UNARY,
        "MemberList": UNARY,
        "MemberPromote": UNARY,
    },
    "Maintenance": {
        "Alarm": UNARY,
        "Status": UNARY,
        "Defragment": UNARY,
        "Hash": UNARY,
        "HashKV": UNARY,
        "Snapshot": SERVER_STREAM,
        "MoveLeader": UNARY,
        "Downgrade": UNARY,
    },
    "Auth": {
        name: UNARY
        for name in (
            "AuthEnable",
            "AuthDisable",
            "AuthStatus",
            "Authenticate",
            "UserAdd",
            "UserGet",
            "UserList",
            "UserDelete",
            "UserChangePassword",
            "UserGrantRole",
            "UserRevokeRole",
            "RoleAdd",
            "RoleGet",
            "RoleList",
            "RoleDelete",
            "RoleGrantPermission",
            "RoleRevokePermission",
        )
    },
}


def pinned_grpcio_tools() -> str:
    with open(ROOT / "pyproject.toml", "rb") as f:
        dev = tomllib.load(f)["project"]["optional-dependencies"]["dev"]
    (pin,) = [d for d in dev if d.startswith("grpcio-tools")]
    assert pin.startswith("grpcio-tools=="), f"grpcio-tools must be pinned exactly: {pin!r}"
    return pin.removeprefix("grpcio-tools==")


def generated_files(root: Path) -> dict[str, bytes]:
    return {
        p.name: p.read_bytes()
        for p in sorted((root / PACKAGE).iterdir())
        if p.name.endswith(GENERATED_SUFFIXES)
    }


def test_committed_code_is_what_genproto_generates(tmp_path):
    pin = pinned_grpcio_tools()
    installed = importlib.metadata.version("grpcio-tools")
    assert installed == pin, f"grpcio-tools {installed} installed, pyproject pins {pin}"
    protos = sorted(str(p.relative_to(ROOT)) for p in (ROOT / PACKAGE).glob("*.proto"))
    assert protos == [
        f"{PACKAGE}/auth.proto",
        f"{PACKAGE}/kv.proto",
        f"{PACKAGE}/lease.proto",
        f"{PACKAGE}/rpc.proto",
    ]
    # The Makefile's command, with the three outputs sent to tmp_path instead of the root.
    out = f"{tmp_path}"
    cmd = [sys.executable, "-m", "grpc_tools.protoc", "-I", "."]
    cmd += [f"--python_out={out}", f"--pyi_out={out}", f"--grpc_python_out={out}", *protos]
    subprocess.run(cmd, cwd=ROOT, check=True, timeout=60)
    fresh, committed = generated_files(tmp_path), generated_files(ROOT)
    assert len(fresh) == 3 * len(protos)
    missing, extra = sorted(set(fresh) - set(committed)), sorted(set(committed) - set(fresh))
    assert not missing and not extra, f"not committed: {missing}; left over: {extra}"
    stale = [name for name in fresh if fresh[name] != committed[name]]
    assert not stale, f"{stale} differ from a fresh generation: run `make genproto`"


def test_services_are_etcds():
    descriptors = (kv_pb2.DESCRIPTOR, auth_pb2.DESCRIPTOR, lease_pb2.DESCRIPTOR, rpc_pb2.DESCRIPTOR)
    files = {f.name: f for f in descriptors}
    assert {name: f.package for name, f in files.items()} == {
        f"{PACKAGE}/kv.proto": "mvccpb",
        f"{PACKAGE}/auth.proto": "authpb",
        f"{PACKAGE}/lease.proto": "leasepb",
        f"{PACKAGE}/rpc.proto": "etcdserverpb",
    }
    assert not any(f.services_by_name for f in descriptors[:3])
    services = rpc_pb2.DESCRIPTOR.services_by_name
    assert sorted(services) == sorted(ETCD_RPCS)
    for service, rpcs in ETCD_RPCS.items():
        methods = services[service].methods
        assert [m.name for m in methods] == list(rpcs), service
        for m in methods:
            assert (m.client_streaming, m.server_streaming) == rpcs[m.name], m.full_name
            assert m.input_type.file is rpc_pb2.DESCRIPTOR


class RecordingChannel:
    """Stands in for a grpc.Channel: records the (path, kind) of each callable a stub makes."""

    def __init__(self):
        self.calls: list[tuple[str, str]] = []

    def _make(self, kind):
        def make(path, request_serializer=None, response_deserializer=None, **_):
            self.calls.append((path, kind))
            return object()

        return make

    def __getattr__(self, kind):
        if kind in ("unary_unary", "unary_stream", "stream_unary", "stream_stream"):
            return self._make(kind)
        raise AttributeError(kind)


def test_stubs_call_etcds_method_paths():
    kinds = {UNARY: "unary_unary", SERVER_STREAM: "unary_stream", BIDI: "stream_stream"}
    for service, rpcs in ETCD_RPCS.items():
        channel = RecordingChannel()
        getattr(rpc_pb2_grpc, f"{service}Stub")(channel)
        expected = [
            (f"/etcdserverpb.{service}/{name}", kinds[shape]) for name, shape in rpcs.items()
        ]
        assert channel.calls == expected


def test_field_numbers_on_the_wire():
    # KeyValue: fields 1..6 in etcd's order (mod_revision 3 before version 4).
    kv = kv_pb2.KeyValue(
        key=b"k", create_revision=2, mod_revision=3, version=4, value=b"v", lease=6
    )
    assert kv.SerializeToString() == b"\x0a\x01k\x10\x02\x18\x03\x20\x04\x2a\x01v\x30\x06"
    # Compare: tag 64 (range_end) is the two-byte varint 0x82 0x04; lease (8) in target_union.
    cmp = rpc_pb2.Compare(
        key=b"k", range_end=b"z", target=rpc_pb2.Compare.LEASE, result=rpc_pb2.Compare.NOT_EQUAL
    )
    cmp.lease = 7
    assert cmp.SerializeToString() == b"\x08\x03\x10\x04\x1a\x01k\x40\x07\x82\x04\x01z"
    assert cmp.WhichOneof("target_union") == "lease"
    # WatchResponse.events is field 11 (tag 0x5a), after fragment = 7.
    resp = rpc_pb2.WatchResponse(
        watch_id=1,
        fragment=True,
        events=[kv_pb2.Event(type=kv_pb2.Event.DELETE, kv=kv_pb2.KeyValue(key=b"a"))],
    )
    wire = resp.SerializeToString()
    assert wire == b"\x10\x01\x38\x01\x5a\x07\x08\x01\x12\x03\x0a\x01a"
    assert rpc_pb2.WatchResponse.FromString(wire) == resp
    # WatchCreateRequest: filters packed (5), watch_id 7, fragment 8.
    create = rpc_pb2.WatchCreateRequest(
        key=b"a", filters=[rpc_pb2.WatchCreateRequest.NODELETE], watch_id=3, fragment=True
    )
    assert create.SerializeToString() == b"\x0a\x01a\x2a\x01\x01\x38\x03\x40\x01"


def test_a_txn_round_trips():
    txn = rpc_pb2.TxnRequest(
        compare=[rpc_pb2.Compare(key=b"a", target=rpc_pb2.Compare.MOD, mod_revision=5)],
        success=[rpc_pb2.RequestOp(request_put=rpc_pb2.PutRequest(key=b"a", value=b"1"))],
        failure=[
            rpc_pb2.RequestOp(
                request_range=rpc_pb2.RangeRequest(
                    key=b"a",
                    sort_order=rpc_pb2.RangeRequest.DESCEND,
                    sort_target=rpc_pb2.RangeRequest.MOD,
                )
            )
        ],
    )
    back = rpc_pb2.TxnRequest.FromString(txn.SerializeToString())
    assert back == txn
    assert back.failure[0].WhichOneof("request") == "request_range"
    assert back.failure[0].request_range.sort_order == 2
    assert back.failure[0].request_range.sort_target == 3


def test_json_names_are_etcds():
    """The gateway's JSON names come from the field names: etcd's camelCase ones stay so."""
    status = rpc_pb2.StatusResponse(dbSizeInUse=10, isLearner=True, raftAppliedIndex=4)
    assert json_format.MessageToDict(status) == {
        "dbSizeInUse": "10",
        "isLearner": True,
        "raftAppliedIndex": "4",
    }
    member = rpc_pb2.Member(ID=1, peerURLs=["http://p"], isLearner=True)
    assert json_format.MessageToDict(member, preserving_proto_field_name=True) == {
        "ID": "1",
        "peerURLs": ["http://p"],
        "isLearner": True,
    }
    perm = auth_pb2.Permission(permType=auth_pb2.Permission.READWRITE, key=b"a")
    assert json_format.MessageToDict(perm) == {"permType": "READWRITE", "key": "YQ=="}
    assert rpc_pb2.AlarmType.Value("CORRUPT") == 2
    assert rpc_pb2.MemberListRequest(linearizable=True).SerializeToString() == b"\x08\x01"
