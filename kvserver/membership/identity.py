"""Member identity: member and cluster IDs, ``--initial-cluster`` parsing, the WAL's identity
record.

``--initial-cluster`` is ``name1=http://127.0.0.1:2380,name2=http://...`` (a name may repeat
to give several URLs). An initial member's ID is a hash of its sorted peer URLs and the cluster
token, so every node computes the same IDs from the same flags without talking to the others;
the cluster ID is a hash of the sorted initial member IDs. IDs are non-zero 64-bit integers
(raft uses 0 for "none"). Peers check the cluster ID on every connection, so nodes of two
clusters never exchange messages. A member added later gets a fresh random ID from the leader
instead (``kvserver.membership.reconfig.new_member_id``).

A member's WAL starts with a metadata record holding its IDs, etcd's
``etcdserverpb.Metadata`` encoding ``{node_id=1, cluster_id=2}`` (``encode_metadata`` /
``decode_metadata``), so a data directory cannot be started as another member or in another
cluster, and a restarted node takes its identity from it, never from the flags.

Malformed or inconsistent flags raise ``ClusterConfigError`` with a message naming them.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable
from urllib.parse import urlsplit

import raftpb
from kvserver.kvpb.member import Member

__all__ = [
    "ClusterConfigError",
    "check_url",
    "cluster_id",
    "decode_metadata",
    "encode_metadata",
    "member_id",
    "parse_initial_cluster",
]


class ClusterConfigError(ValueError):
    """The --initial-cluster / URL flags are malformed or inconsistent."""


def _hash64(*parts: bytes) -> int:
    digest = hashlib.sha1(b"".join(parts)).digest()
    value = int.from_bytes(digest[:8], "big")
    return value or 1


def member_id(peer_urls: tuple[str, ...] | list[str], cluster_token: str) -> int:
    urls = "".join(sorted(peer_urls)).encode()
    return _hash64(urls, cluster_token.encode())


def cluster_id(member_ids: Iterable[int]) -> int:
    return _hash64(*(i.to_bytes(8, "big") for i in sorted(member_ids)))


def check_url(url: str) -> str:
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.hostname or not parts.port:
        raise ClusterConfigError(f"bad URL {url!r}: want scheme://host:port")
    return url.rstrip("/")


def parse_initial_cluster(text: str, cluster_token: str) -> list[Member]:
    """Parse ``name=url[,name=url...]`` (a name may repeat to give several URLs)."""
    urls_by_name: dict[str, list[str]] = {}
    for item in filter(None, (part.strip() for part in text.split(","))):
        name, sep, url = item.partition("=")
        if not sep or not name:
            raise ClusterConfigError(f"bad --initial-cluster item {item!r}: want name=url")
        urls_by_name.setdefault(name, []).append(check_url(url))
    if not urls_by_name:
        raise ClusterConfigError("--initial-cluster is empty")
    members = [
        Member(member_id(urls, cluster_token), name, tuple(urls))
        for name, urls in urls_by_name.items()
    ]
    if len({m.id for m in members}) != len(members):
        raise ClusterConfigError("two members of --initial-cluster share the same peer URLs")
    return sorted(members, key=lambda m: m.id)


def encode_metadata(member_id: int, cluster_id: int) -> bytes:
    return raftpb.wire.uint_field(1, member_id) + raftpb.wire.uint_field(2, cluster_id)


def decode_metadata(data: bytes) -> tuple[int, int]:
    fields = {num: value for num, _, value in raftpb.wire.iter_fields(data)}
    member_id, cluster_id = fields.get(1, 0), fields.get(2, 0)
    if not isinstance(member_id, int) or not isinstance(cluster_id, int):
        raise raftpb.wire.DecodeError("WAL metadata: member and cluster IDs must be varints")
    return member_id, cluster_id
