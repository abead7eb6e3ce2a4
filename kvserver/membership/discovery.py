"""Identity at start: which member this node is, and of which cluster.

``resolve_identity`` answers ``(member id, cluster id, known members)`` for a node about to
start, from the first source that applies:

- its WAL (``read_wal_identity``): a restarted node takes both IDs from the WAL's metadata
  record, never from the flags (as etcd);
- the running cluster, for ``--initial-cluster-state existing``: a node added with ``member
  add`` asks the members it was told about (``discover_cluster``: ``GET /raft/members`` on
  their peer URLs) and is the member whose peer URLs are its own. A member that has not applied
  the ``member add`` yet may list the cluster without it; joining fails only when the node
  stays unlisted for ``NOT_LISTED_GRACE_S``, or when no member answers within the timeout
  (``ClusterConfigError`` either way);
- else the flags: the IDs derived from ``--initial-cluster`` (``kvserver.membership.identity``).

The known members seed the registry of a node that is not in the configuration yet; they carry
no client URLs (those are published through raft), so every member derives the same seeds.
"""

from __future__ import annotations

import asyncio
import logging
import os
from collections.abc import Iterable
from dataclasses import replace

from kvserver.kvpb.member import Member
from kvserver.membership.identity import ClusterConfigError, decode_metadata
from wal.decoder import iter_raw_records

__all__ = [
    "NOT_LISTED_GRACE_S",
    "discover_cluster",
    "read_wal_identity",
    "resolve_identity",
]

log = logging.getLogger(__name__)


def read_wal_identity(wal_dir: str) -> tuple[int, int] | None:
    """``(member_id, cluster_id)`` from the WAL's metadata record, or None without a WAL."""
    try:
        names = sorted(n for n in os.listdir(wal_dir) if n.endswith(".wal"))
    except FileNotFoundError:
        return None
    for name in names:
        with open(os.path.join(wal_dir, name), "rb") as f:
            head = f.read(1 << 16)
        try:
            for rec in iter_raw_records(head):
                if rec.type == 1 and rec.data is not None:
                    return decode_metadata(rec.data)
        except Exception:  # a damaged head: let storage recovery report it
            continue
    return None


# How long members may keep answering without this member before joining fails: a `member
# add` is answered once the leader applied it, and the others apply it a moment later.
NOT_LISTED_GRACE_S = 5.0


async def discover_cluster(
    local_peer_urls: tuple[str, ...],
    peer_urls: Iterable[str],
    timeout_s: float = 30.0,
    *,
    peer_ssl=None,
) -> tuple[int, int, list[Member]]:
    """Ask running members (``GET /raft/members`` on their peer URLs) for the cluster:
    returns ``(local member id, cluster id, members)``; the local ID is the member whose
    peer URLs are ours (it was added with ``member add``)."""
    import aiohttp

    urls = [u for u in peer_urls if u not in local_peer_urls]
    if not urls:
        raise ClusterConfigError(
            "--initial-cluster-state existing: --initial-cluster names no other member to join"
        )
    deadline = asyncio.get_running_loop().time() + timeout_s
    not_listed_since: float | None = None  # when a member first answered without us
    last_error = "no answer"
    # peer_ssl: the member's peer TLS dial context (kvserver.tls) for https peer URLs
    async with aiohttp.ClientSession(
        timeout=aiohttp.ClientTimeout(total=2.0),
        connector=aiohttp.TCPConnector(ssl=True if peer_ssl is None else peer_ssl),
    ) as session:
        while True:
            for url in urls:
                try:
                    async with session.get(url.rstrip("/") + "/raft/members") as resp:
                        if resp.status != 200:
                            last_error = f"{url}: HTTP {resp.status}"
                            continue
                        body = await resp.json()
                    members = [Member.from_json(m) for m in body["members"]]
                    cid = int(body["cluster_id"])
                except (
                    aiohttp.ClientError,
                    OSError,
                    TimeoutError,
                    ValueError,
                    KeyError,
                    TypeError,
                ) as exc:
                    last_error = f"{url}: {exc}"
                    continue
                mine = set(local_peer_urls)
                for m in members:
                    if set(m.peer_urls) == mine:
                        return m.id, cid, members
                # Not final: a member that has not applied the `member add` yet (it was just
                # committed) lists the cluster without us; ask the others, and again.
                if not_listed_since is None:
                    not_listed_since = asyncio.get_running_loop().time()
            now = asyncio.get_running_loop().time()
            if not_listed_since is not None and now - not_listed_since >= NOT_LISTED_GRACE_S:
                raise ClusterConfigError(
                    f"this member's peer URLs {','.join(local_peer_urls)} are not in the "
                    f"cluster's member list (add it first: raftkv member add NAME "
                    f"--peer-urls {','.join(local_peer_urls)})"
                )
            if now >= deadline:
                raise ClusterConfigError(f"cannot reach the existing cluster: {last_error}")
            await asyncio.sleep(0.2)


async def resolve_identity(
    cfg, derived_member_id: int, derived_cluster_id: int, *, peer_ssl=None
) -> tuple[int, int, list[Member]]:
    """``(member id, cluster id, known members)`` of the member ``cfg`` describes: from its
    WAL when it has one (a restart: the flags are not consulted, as etcd), else from the
    running cluster for ``--initial-cluster-state existing``, else derived from the flags."""
    # Seeds must be what every node derives alike (no client URLs: those are published
    # through raft), or the registries of the members would differ.
    local = Member(derived_member_id, cfg.name, tuple(cfg.initial_advertise_peer_urls))
    known = [m for m in cfg.members if m.name != cfg.name]
    ident = read_wal_identity(cfg.wal_dir)
    if ident is not None:
        mid, cid = ident
        return mid, cid, [*known, replace(local, id=mid)]
    if cfg.initial_cluster_state == "existing":
        peer_urls = [u for m in cfg.members if m.name != cfg.name for u in m.peer_urls]
        mid, cid, remote = await discover_cluster(local.peer_urls, peer_urls, peer_ssl=peer_ssl)
        log.info("joining cluster %x as member %x (%d members)", cid, mid, len(remote))
        return mid, cid, remote
    return derived_member_id, derived_cluster_id, [*known, local]
