"""Between etcd's protobuf messages (``kvserver.etcdpb``) and the service's dataclasses
(``kvserver.kvpb``): the gRPC dialect's only translation.

Contract: ``*_from_pb`` turn a decoded request into the dataclass ``KVService`` takes, with
the same meaning etcd gives every field (a oneof that is not set is None; enum numbers are
etcd's, so an unknown number is refused as InvalidArgument by ``bad_enum``). ``*_to_pb`` build
the response message, header included. Nothing here touches the store or the loop's time:
a big ``RangeResponse`` is converted in slices by the caller (``kv_slices``).
"""

from __future__ import annotations

import functools
from collections.abc import Iterable, Sequence
from enum import IntEnum

from kvserver.etcdpb import kv_pb2, rpc_pb2
from kvserver.kvpb import kv as K
from kvserver.kvpb.quick import quick_constructor
from kvserver.kvpb.service_errors import GrpcCode, ServiceError


def bad_enum(what: str, value: int) -> ServiceError:
    return ServiceError(GrpcCode.INVALID_ARGUMENT, f"raftkv: unknown {what} {value}")


@functools.cache
def _members(kind: type[IntEnum]) -> dict[int, IntEnum]:
    return {member.value: member for member in kind}


def _enum(kind, what: str, value: int):  # type: ignore[no-untyped-def]
    # a dict lookup costs a tenth of ``kind(value)``, and a range converts two enums
    member = _members(kind).get(value)
    if member is None:
        raise bad_enum(what, value)
    return member


# --- requests ---------------------------------------------------------------------------------


def range_from_pb(m: rpc_pb2.RangeRequest) -> K.RangeRequest:
    return K.RangeRequest(
        key=m.key,
        range_end=m.range_end,
        limit=m.limit,
        revision=m.revision,
        sort_order=_enum(K.SortOrder, "sort order", m.sort_order),
        sort_target=_enum(K.SortTarget, "sort target", m.sort_target),
        serializable=m.serializable,
        keys_only=m.keys_only,
        count_only=m.count_only,
        min_mod_revision=m.min_mod_revision,
        max_mod_revision=m.max_mod_revision,
        min_create_revision=m.min_create_revision,
        max_create_revision=m.max_create_revision,
    )


# A txn of puts converts two messages per put: built by quick constructors (positional,
# in the fields' declared order), a third of what the frozen dataclasses' own cost.
_new_put = quick_constructor(K.PutRequest)
_new_op = quick_constructor(K.RequestOp)


def put_from_pb(m: rpc_pb2.PutRequest) -> K.PutRequest:
    return _new_put(m.key, m.value, m.lease, m.prev_kv, m.ignore_value, m.ignore_lease)


def delete_from_pb(m: rpc_pb2.DeleteRangeRequest) -> K.DeleteRangeRequest:
    return K.DeleteRangeRequest(key=m.key, range_end=m.range_end, prev_kv=m.prev_kv)


def _compare_from_pb(m: rpc_pb2.Compare) -> K.Compare:
    target = _enum(K.CompareTarget, "compare target", m.target)
    set_field = m.WhichOneof("target_union")
    # etcd compares the field the target names; a oneof left unset compares against zero.
    value = getattr(m, set_field) if set_field else None
    fields: dict = {}
    if target is K.CompareTarget.VERSION:
        fields["version"] = value if set_field == "version" else 0
    elif target is K.CompareTarget.CREATE:
        fields["create_revision"] = value if set_field == "create_revision" else 0
    elif target is K.CompareTarget.MOD:
        fields["mod_revision"] = value if set_field == "mod_revision" else 0
    elif target is K.CompareTarget.VALUE:
        fields["value"] = value if set_field == "value" else b""
    else:
        fields["lease"] = value if set_field == "lease" else 0
    return K.Compare(
        result=_enum(K.CompareResult, "compare result", m.result),
        target=target,
        key=m.key,
        range_end=m.range_end,
        **fields,
    )


def _op_from_pb(m: rpc_pb2.RequestOp) -> K.RequestOp:
    which = m.WhichOneof("request")
    if which == "request_range":
        return K.RequestOp(request_range=range_from_pb(m.request_range))
    if which == "request_put":
        return _new_op(None, put_from_pb(m.request_put), None, None)
    if which == "request_delete_range":
        return K.RequestOp(request_delete_range=delete_from_pb(m.request_delete_range))
    if which == "request_txn":
        return K.RequestOp(request_txn=txn_from_pb(m.request_txn))
    return K.RequestOp()  # an empty op: etcd's validation refuses it


def txn_from_pb(m: rpc_pb2.TxnRequest) -> K.TxnRequest:
    return K.TxnRequest(
        compare=tuple(_compare_from_pb(c) for c in m.compare),
        success=tuple(_op_from_pb(op) for op in m.success),
        failure=tuple(_op_from_pb(op) for op in m.failure),
    )


def compaction_from_pb(m: rpc_pb2.CompactionRequest) -> K.CompactionRequest:
    return K.CompactionRequest(revision=m.revision, physical=m.physical)


# --- responses --------------------------------------------------------------------------------


def header_to_pb(h: K.ResponseHeader) -> rpc_pb2.ResponseHeader:
    return rpc_pb2.ResponseHeader(
        cluster_id=h.cluster_id, member_id=h.member_id, revision=h.revision, raft_term=h.raft_term
    )


def kv_to_pb(kv: K.KeyValue) -> kv_pb2.KeyValue:
    return kv_pb2.KeyValue(
        key=kv.key,
        value=kv.value,
        create_revision=kv.create_revision,
        mod_revision=kv.mod_revision,
        version=kv.version,
        lease=kv.lease,
    )


def kvs_to_pb(kvs: Iterable[K.KeyValue]) -> list[kv_pb2.KeyValue]:
    return [kv_to_pb(kv) for kv in kvs]


def range_to_pb(
    r: K.RangeResponse, kvs: Sequence[K.KeyValue] | None = None
) -> rpc_pb2.RangeResponse:
    """``kvs``: the part of ``r.kvs`` to put in this message (all of them by default)."""
    return rpc_pb2.RangeResponse(
        header=header_to_pb(r.header),
        kvs=kvs_to_pb(r.kvs if kvs is None else kvs),
        more=r.more,
        count=r.count,
    )


def put_to_pb(r: K.PutResponse) -> rpc_pb2.PutResponse:
    out = rpc_pb2.PutResponse(header=header_to_pb(r.header))
    if r.prev_kv is not None:
        out.prev_kv.CopyFrom(kv_to_pb(r.prev_kv))
    return out


def delete_to_pb(r: K.DeleteRangeResponse) -> rpc_pb2.DeleteRangeResponse:
    return rpc_pb2.DeleteRangeResponse(
        header=header_to_pb(r.header), deleted=r.deleted, prev_kvs=kvs_to_pb(r.prev_kvs)
    )


def _op_to_pb(op: K.ResponseOp) -> rpc_pb2.ResponseOp:
    if op.response_range is not None:
        return rpc_pb2.ResponseOp(response_range=range_to_pb(op.response_range))
    if op.response_put is not None:
        return rpc_pb2.ResponseOp(response_put=put_to_pb(op.response_put))
    if op.response_delete_range is not None:
        return rpc_pb2.ResponseOp(response_delete_range=delete_to_pb(op.response_delete_range))
    if op.response_txn is not None:
        return rpc_pb2.ResponseOp(response_txn=txn_to_pb(op.response_txn))
    return rpc_pb2.ResponseOp()


def txn_to_pb(r: K.TxnResponse) -> rpc_pb2.TxnResponse:
    ops = r.responses
    if len(ops) > 1 and len(set(map(id, ops))) == 1:
        # The store answers every bare put of a txn with one shared ResponseOp: converted
        # once, copied by protobuf into each place.
        responses = [_op_to_pb(ops[0])] * len(ops)
    else:
        responses = [_op_to_pb(op) for op in ops]
    return rpc_pb2.TxnResponse(
        header=header_to_pb(r.header), succeeded=r.succeeded, responses=responses
    )


def compaction_to_pb(r: K.CompactionResponse) -> rpc_pb2.CompactionResponse:
    return rpc_pb2.CompactionResponse(header=header_to_pb(r.header))


def event_to_pb(e: K.Event) -> kv_pb2.Event:
    out = kv_pb2.Event(type=int(e.type), kv=kv_to_pb(e.kv))  # type: ignore[arg-type]
    if e.prev_kv is not None:
        out.prev_kv.CopyFrom(kv_to_pb(e.prev_kv))
    return out
