"""The replicated KV service: the MVCC store as raft's state machine, served as KVService.

Writes are encoded once (``mvcc.codec.encode_entry`` with the client's request id), proposed
through the node and answered with the result this node computed when it applied the entry.
Linearizable reads wait for a ReadIndex barrier and then read the local store; serializable
reads read it at once. Every response gets a full header (cluster, member, revision, term).
"""

import dataclasses
import gc

from kvserver.mvcc.codec import encode_entry
from kvserver.mvcc.store import MVCCStore
from kvserver.mvcc.types import (
    CompactionRequest,
    CompactionResponse,
    DeleteRangeRequest,
    DeleteRangeResponse,
    PutRequest,
    PutResponse,
    RangeRequest,
    RangeResponse,
    ResponseHeader,
    TxnRequest,
    TxnResponse,
)
from kvserver.mvcc.validate import check_delete, check_put, check_range, check_txn
from kvserver.node import Node
from kvserver.service import MemberInfo, NodeStatus


class RaftKV:
    """Implements ``kvserver.node.StateMachine`` and ``kvserver.service.KVService``."""

    def __init__(self, *, cluster_id: int, member_id: int, name: str,
                 members: tuple[MemberInfo, ...], max_txn_ops: int = 128):
        self.cluster_id = cluster_id
        self.member_id = member_id
        self.name = name
        self.members = members
        self.max_txn_ops = max_txn_ops
        self.store = MVCCStore()
        self.node: Node | None = None      # set once the node is built (they refer to each other)

    # --- StateMachine ------------------------------------------------------------------------

    def apply(self, index: int, payload: bytes) -> object:
        result = self.store.apply_entry(payload)
        return result.error if result.error is not None else result.response

    def snapshot_chunks(self):
        return self.store.serialize()

    def restore(self, data: bytes) -> None:
        self.store = MVCCStore.restore([data])
        # The restored store is long-lived: keep the cyclic GC from walking it again and
        # again (a full collection over a large store stalls the loop for tens of ms).
        gc.freeze()

    # --- KVService ---------------------------------------------------------------------------

    def _header(self, revision: int) -> ResponseHeader:
        return ResponseHeader(self.cluster_id, self.member_id, revision, self.node.term)

    def _finish(self, response):
        return dataclasses.replace(response, header=self._header(response.header.revision))

    async def range(self, req: RangeRequest) -> RangeResponse:
        check_range(req)
        if not req.serializable:
            await self.node.read_barrier()
        result = self.store.apply(req)
        if result.error is not None:
            raise result.error
        return self._finish(result.response)

    async def _write(self, req, client_id: int, request_id: int):
        result = await self.node.propose(encode_entry(req, client_id, request_id))
        return self._finish(result)

    async def put(self, req: PutRequest, *, client_id: int = 0,
                  request_id: int = 0) -> PutResponse:
        check_put(req)  # refuse bad input before it reaches the log
        return await self._write(req, client_id, request_id)

    async def delete_range(self, req: DeleteRangeRequest, *, client_id: int = 0,
                           request_id: int = 0) -> DeleteRangeResponse:
        check_delete(req)
        return await self._write(req, client_id, request_id)

    async def txn(self, req: TxnRequest, *, client_id: int = 0,
                  request_id: int = 0) -> TxnResponse:
        check_txn(req, self.max_txn_ops)
        return await self._write(req, client_id, request_id)

    async def compact(self, req: CompactionRequest) -> CompactionResponse:
        return await self._write(req, 0, 0)

    def status(self) -> NodeStatus:
        node = self.node
        st = node.status()
        is_learner = self.member_id in st["learners"]
        return NodeStatus(
            member_id=self.member_id, cluster_id=self.cluster_id, name=self.name,
            leader=node.leader, raft_term=node.term, raft_index=st["committed"],
            raft_applied_index=node.applied, revision=self.store.revision,
            compact_revision=self.store.compact_revision,
            db_size_bytes=self.store.history_size * 64, is_learner=is_learner,
            members=self.members)
