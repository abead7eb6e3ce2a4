"""Lease messages (etcd's etcdserverpb Lease service) that a client sends or receives.

Names are etcdserverpb's in snake_case with the unit last (``ttl_s``). A grant with
``lease_id == 0`` lets the server choose the ID; a TTL above ``MAX_LEASE_TTL_S`` is refused.
``LeaseTimeToLiveResponse.ttl_s`` is -1 for an unknown lease (what etcd's gRPC layer answers),
and ``LeaseLeasesResponse`` lists IDs soonest deadline first.
"""

from __future__ import annotations

from dataclasses import dataclass

from kvserver.kvpb.kv import ResponseHeader

__all__ = [
    "MAX_LEASE_TTL_S",
    "LeaseGrantRequest",
    "LeaseGrantResponse",
    "LeaseKeepAliveResponse",
    "LeaseLeasesResponse",
    "LeaseRevokeRequest",
    "LeaseRevokeResponse",
    "LeaseTimeToLiveResponse",
]

# etcd's lease.MaxLeaseTTL (seconds): larger TTLs are refused.
MAX_LEASE_TTL_S = 9_000_000_000


@dataclass(frozen=True, slots=True)
class LeaseGrantRequest:
    """etcdserverpb.LeaseGrantRequest. ``lease_id == 0``: the server chooses (at propose)."""

    ttl_s: int
    lease_id: int = 0


@dataclass(frozen=True, slots=True)
class LeaseRevokeRequest:
    lease_id: int


@dataclass(frozen=True, slots=True)
class LeaseGrantResponse:
    header: ResponseHeader
    lease_id: int
    ttl_s: int


@dataclass(frozen=True, slots=True)
class LeaseRevokeResponse:
    header: ResponseHeader


@dataclass(frozen=True, slots=True)
class LeaseKeepAliveResponse:
    header: ResponseHeader
    lease_id: int
    ttl_s: int


@dataclass(frozen=True, slots=True)
class LeaseTimeToLiveResponse:
    """``ttl_s`` is the remaining TTL truncated to whole seconds (-1: no such lease);
    ``granted_ttl_s`` the TTL granted; ``keys`` the attached keys, sorted, if asked for."""

    header: ResponseHeader
    lease_id: int
    ttl_s: int
    granted_ttl_s: int = 0
    keys: tuple[bytes, ...] = ()


@dataclass(frozen=True, slots=True)
class LeaseLeasesResponse:
    """Lease IDs by deadline (then ID); on a follower all deadlines are equal, so by ID."""

    header: ResponseHeader
    leases: tuple[int, ...] = ()
