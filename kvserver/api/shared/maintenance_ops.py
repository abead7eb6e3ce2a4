"""etcd's Maintenance calls Defragment, Hash, HashKV and MoveLeader, for every dialect: each
takes a ``KVService`` and returns the typed answer (``kvserver.api.http.maintenance_ops`` says
what each one does and serves them on the JSON gateway; ``kvserver.api.grpc.maintenance``
converts the same values)."""

from __future__ import annotations

import logging

from kvserver.kvpb.kv import ResponseHeader
from kvserver.mvcc.hashkv import HashKVResponse
from kvserver.server.service import KVService

log = logging.getLogger(__name__)

# Downgrade (etcd 3.5's, to an older storage version) has nothing to do here.
MSG_NO_DOWNGRADE = "raftkv: Downgrade is not supported (raftkv has one storage version)"


def header(service: KVService) -> ResponseHeader:
    """This member's response header now."""
    s = service.status()
    return ResponseHeader(s.cluster_id, s.member_id, s.revision, s.raft_term)


async def defragment(service: KVService) -> ResponseHeader:
    log.info("defragment: nothing to do (an in-memory store has no free pages)")
    return header(service)


async def hash_all(service: KVService) -> HashKVResponse:
    return await service.hash_kv(0)


async def hash_kv(service: KVService, revision: int) -> HashKVResponse:
    return await service.hash_kv(revision)


async def move_leader(service: KVService, target_id: int) -> ResponseHeader:
    await service.move_leader(target_id)
    return header(service)
