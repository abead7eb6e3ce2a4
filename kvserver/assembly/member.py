"""``raftkv serve``: assemble and run one member — storage, raft node, transport, HTTP.

Startup (``Member.start``):
1. ``bootstrap`` (kvserver.assembly.bootstrap): identity, durable storage, the raft core;
2. build the parts around the node, each given its collaborators in its constructor: the
   node, the membership service, the peer transport, the archive (``--archive-url``), the
   replicated KV service; restore the KV state machine from the newest snapshot;
3. start them: the transport, membership (given the transport), the node (given its
   handlers: state machine, send, membership), the KV service's background tasks;
4. serve peers on ``--listen-peer-urls`` and clients on ``--listen-client-urls``: each client
   URL serves etcd's gRPC API and the HTTP API (``kvserver.api.grpc.mux``).

SIGTERM / SIGINT stop the member cleanly (HTTP first, then the raft loop, then the WAL).
"""

import asyncio
import functools
import logging
import os
import signal
import socket
import sys
import time

import grpc
from aiohttp import web

from kvserver.api.grpc.budgets import Http2Limits
from kvserver.api.grpc.frontends import ClientListener
from kvserver.api.grpc.mux import advertise_alpn, client_port_factory
from kvserver.api.grpc.server import GrpcServer
from kvserver.api.http.app import build_client_app
from kvserver.api.http.common import FRONTENDS_KEY, SNAPSHOT_GATE_KEY
from kvserver.api.http.connguard import ConnectionGuard, raise_nofile_limit
from kvserver.api.http.forward import FORWARD_SSL_KEY
from kvserver.api.http.ui import UI_CONFIG_KEY, UiConfig
from kvserver.api.shared.snapshot_capture import SnapshotGate
from kvserver.archive import member as archive_member
from kvserver.archive.member import ArchiverThread
from kvserver.assembly.bootstrap import Bootstrapped, bootstrap
from kvserver.kvpb.alarm import AlarmType
from kvserver.lease.lessor import min_lease_ttl_s
from kvserver.membership.identity import cluster_id as derive_cluster_id
from kvserver.membership.registry import split_members_frame
from kvserver.membership.service import REMOVED_MESSAGE, MembershipService
from kvserver.rafthttp.transport import PeerTransport
from kvserver.server.config import ServerConfig, check_url_schemes, host_port
from kvserver.server.disk_health import SlowDiskGuard, SlowDiskOptions
from kvserver.server.event_loop import run_main
from kvserver.server.gc_pacer import GCPacer, collect_young_less_often, freeze_heap
from kvserver.server.heap_trim import HeapTrimmer
from kvserver.server.loop_monitor import LoopMonitor
from kvserver.server.metrics import AppendCounter, Metrics
from kvserver.server.node import Node, NodeHandlers, NodeOptions
from kvserver.server.node_storage import NodeStorage
from kvserver.server.replicated_kv import RaftKV
from kvserver.server.service import MemberInfo
from kvserver.tls import MemberTLS, member_contexts
from raft.errors import CommitOutOfRangeError
from snap.spill import drop_resident_pages
from wal.errors import is_disk_full

log = logging.getLogger(__name__)


class Member:
    """One running raftkv member."""

    def __init__(self, cfg: ServerConfig):
        self.cfg = cfg
        local = cfg.local_member()
        self.member_id = local.id
        self.cluster_id = derive_cluster_id([m.id for m in cfg.members])
        self.members = tuple(
            MemberInfo(
                m.id, m.name, m.peer_urls, cfg.advertise_client_urls if m.id == local.id else ()
            )
            for m in cfg.members
        )
        self.runners: list[web.AppRunner] = []
        self.client_listeners: list[asyncio.Server] = []  # the client URLs (both dialects)
        self.grpc: GrpcServer | None = None
        self.node: Node | None = None
        self.kv: RaftKV | None = None
        self.storage: NodeStorage | None = None
        self.transport: PeerTransport | None = None
        self.disk_guard: SlowDiskGuard | None = None  # a slow leader gives way; stalls
        self.membership: MembershipService | None = None
        self.appends = AppendCounter()  # MsgApps sent and their entries, for /metrics
        self.gc_pacer = GCPacer()  # keeps full GC passes short over a large store
        self.heap_trimmer = HeapTrimmer()  # returns what a snapshot or compaction freed
        self.loop_monitor = LoopMonitor()  # loop stalls: a histogram, and what held the loop
        self.client_guard = ConnectionGuard()  # client-port connection limits
        self.archive: ArchiverThread | None = None  # the --archive-url thread, if any
        self.tls = MemberTLS()  # kvserver.tls: contexts of the https listeners and dials
        self.snapshot_gate = SnapshotGate(cfg.max_snapshot_streams)

    async def start(self) -> None:
        """Bootstrap, build the running parts around the node, then open the listeners."""
        cfg = self.cfg
        check_url_schemes(cfg)  # config_from_args did; a config built in code must pass too
        self.tls = member_contexts(cfg)  # TLS files load (auto-TLS pairs made) before all else
        boot = await bootstrap(cfg, peer_ssl=self.tls.peer_dial)
        self.member_id, self.cluster_id = boot.member_id, boot.cluster_id
        self.storage = boot.storage
        node = self._build_node(boot)
        membership = self._build_membership(boot, node)
        transport = self._build_transport(node, membership)
        self.disk_guard = SlowDiskGuard(
            node,
            boot.storage.fsync_watch,
            transport.ask_disk_health,
            SlowDiskOptions.from_config(cfg),
        )
        node.health_checks.append(self.disk_guard.problem)
        self.archive = archive_member.start(cfg, self.member_id, self.cluster_id, boot.storage)
        kv = self._build_kv(node, membership)
        if boot.snapshot is not None:
            started = time.monotonic()
            blob, rest = split_members_frame(boot.snapshot.data)
            kv.restore(boot.snapshot.data if blob is None else rest)
            drop_resident_pages(boot.snapshot.data)  # kept mapped for followers
            log.info(
                "restored snapshot %d (%d keys, revision %d) in %.2f s",
                boot.snapshot.metadata.index,
                kv.store.key_count,
                kv.store.revision,
                time.monotonic() - started,
            )
        freeze_heap()  # recovered log and store are long-lived: keep them out of GC passes
        self.gc_pacer.start()
        self.loop_monitor.start()
        await transport.start()
        membership.start(transport)  # connects to the known members
        node.start(
            NodeHandlers(
                state_machine=kv,
                send=self.appends.wrap(transport.send),
                members=membership,
                on_conf_change=membership.on_conf_change,
                on_memory_freed=self.heap_trimmer.request,
            )
        )
        # the lessor's expiry task and auto-compaction (both act only while this member leads)
        kv.start(auto_compaction=cfg.auto_compaction)
        self.disk_guard.start()
        # what reading the WAL and the snapshot at start-up freed
        self.heap_trimmer.request("started")
        await self._serve(node, boot.storage, kv, transport)
        log.info(
            "member %s (%x) of cluster %x serving clients on %s, peers on %s",
            cfg.name,
            self.member_id,
            self.cluster_id,
            ",".join(cfg.listen_client_urls),
            ",".join(cfg.listen_peer_urls),
        )

    def _build_node(self, boot: Bootstrapped) -> Node:
        cfg = self.cfg
        self.node = Node(
            raw=boot.raw,
            node_id=self.member_id,
            storage=boot.storage,
            options=NodeOptions(
                heartbeat_interval_s=cfg.heartbeat_interval_ms / 1000,
                snapshot_count=cfg.snapshot_count,
                snapshot_bytes=cfg.snapshot_bytes,
                snapshot_catchup_entries=cfg.snapshot_catchup_entries,
                snapshot_catchup_bytes=cfg.snapshot_catchup_bytes,
                snapshot_in_child=cfg.snapshot_in_child,
                snapshot_incremental=cfg.snapshot_incremental,
            ),
            applied=boot.applied,
            conf_state=boot.conf_state,
        )
        return self.node

    def _build_membership(self, boot: Bootstrapped, node: Node) -> MembershipService:
        self.membership = MembershipService(
            registry=boot.registry,
            node=node,
            local_id=self.member_id,
            cluster_id=self.cluster_id,
            name=self.cfg.name,
            client_urls=self.cfg.advertise_client_urls,
            on_change=self._members_changed,
        )
        return self.membership

    def _build_transport(self, node: Node, membership: MembershipService) -> PeerTransport:
        assert self.storage is not None  # bootstrapped first
        watch = self.storage.fsync_watch
        self.transport = PeerTransport(
            local_id=self.member_id,
            cluster_id=self.cluster_id,
            on_messages=node.receive,
            on_unreachable=node.report_unreachable,
            on_snapshot_status=node.report_snapshot,
            name=self.cfg.name,
            client_urls=self.cfg.advertise_client_urls,
            is_removed=lambda peer: peer in membership.registry.removed,
            on_removed=membership.peer_removed,
            members_json=membership.members_json,
            ssl_context=self.tls.peer_dial,
            spill_dir=self.cfg.snap_dir,
            disk_health=lambda: watch.health().to_json(),
        )
        return self.transport

    def _build_kv(self, node: Node, membership: MembershipService) -> RaftKV:
        cfg = self.cfg
        self.kv = RaftKV(
            cluster_id=self.cluster_id,
            member_id=self.member_id,
            name=cfg.name,
            members=self.members,
            node=node,
            membership=membership,
            archive_lag=self.archive.archiver.lag if self.archive is not None else None,
            election_timeout_s=cfg.election_timeout_ms / 1000,
            min_lease_ttl_s=min_lease_ttl_s(cfg.heartbeat_interval_ms, cfg.election_timeout_ms),
            quota_backend_bytes=cfg.quota_bytes,
            on_memory_freed=self.heap_trimmer.request,
        )
        return self.kv

    async def _serve(
        self, node: Node, storage: NodeStorage, kv: RaftKV, transport: PeerTransport
    ) -> None:
        """Open the peer and the client listeners."""
        cfg = self.cfg
        metrics = Metrics(node_stats=functools.partial(self._stats, node, storage, kv, transport))
        peer_app = web.Application(client_max_size=(64 << 20))
        peer_app.add_routes(transport.routes())
        client_app = build_client_app(kv, metrics, max_request_bytes=cfg.max_request_bytes)
        # Header/body/idle deadlines and a bound on open connections for the client port
        # (innermost middleware: its 408 is rendered by the app's error middleware).
        client_app.middlewares.append(self.client_guard.middleware)
        client_app[FORWARD_SSL_KEY] = self.tls.client_dial  # forwarding to an https leader
        client_app[SNAPSHOT_GATE_KEY] = self.snapshot_gate
        if cfg.grpc_frontends:
            client_app[FRONTENDS_KEY] = self._frontends_ready
        client_app[UI_CONFIG_KEY] = UiConfig(
            write=cfg.ui_write, archiver=self.archive.archiver if self.archive else None
        )
        # Bounded graceful stop: in-flight requests get a moment, then connections close.
        peer_runner = web.AppRunner(
            peer_app, access_log=None, handle_signals=False, shutdown_timeout=2.0
        )
        await peer_runner.setup()
        self.runners.append(peer_runner)
        for url in cfg.listen_peer_urls:
            host, port = host_port(url)
            # https URLs only (check_url_schemes made sure the context exists for them)
            ssl_context = self.tls.peer_server if url.startswith("https://") else None
            await web.TCPSite(
                peer_runner, host, port, reuse_address=True, ssl_context=ssl_context
            ).start()
        # Each client URL serves both dialects: HTTP/2 connections go to the gRPC server,
        # the rest to the HTTP app (kvserver.api.grpc.mux).
        client_runner = self.client_guard.runner(
            client_app, access_log=None, handle_signals=False, shutdown_timeout=2.0
        )
        await client_runner.setup()
        assert client_runner.server is not None
        self.runners.append(client_runner)
        self.grpc = GrpcServer(
            kv,
            kv.auth,
            max_request_bytes=cfg.max_request_bytes,
            forward_credentials=grpc_client_credentials(cfg),
            limits=client_limits(cfg),
            snapshot_gate=self.snapshot_gate,
        )
        metrics.registry.register(self.grpc.collector())
        factory = client_port_factory(client_runner.server, self.grpc)
        loop = asyncio.get_running_loop()
        listeners = []
        for url in cfg.listen_client_urls:
            host, port = host_port(url)
            tls = self.tls.client_server if url.startswith("https://") else None
            if port is None:  # aiohttp's TCPSite defaults, as before
                port = 8443 if tls is not None else 8080
            context = advertise_alpn(tls) if tls is not None else None
            if cfg.grpc_frontends:  # the front ends accept (while none is ready, the member)
                listeners.append(ClientListener(listening_socket(host, port), context))
                continue
            self.client_listeners.append(
                await loop.create_server(factory, host, port, ssl=context, reuse_address=True)
            )
        if cfg.grpc_frontends:
            await self.grpc.start_frontends(
                cfg.grpc_frontends,
                cfg.frontend_max_calls,
                listeners,
                http_protocol=client_runner.server,
                fallback_protocol=factory,
                tls=self.tls.client_info,
            )

    def _frontends_ready(self) -> tuple[int, int]:
        pool = self.grpc.frontends if self.grpc is not None else None
        return (pool.ready if pool is not None else 0), self.cfg.grpc_frontends

    def running(self) -> tuple[Node, MembershipService]:
        """The node and the membership service of a started member."""
        if self.node is None or self.membership is None:
            raise RuntimeError("the member is not started")
        return self.node, self.membership

    def _members_changed(self, members) -> None:
        self.members = tuple(
            MemberInfo(m.id, m.name, m.peer_urls, m.client_urls, m.is_learner) for m in members
        )
        if self.kv is not None:
            self.kv.members = self.members

    def _stats(
        self, node: Node, storage: NodeStorage, kv: RaftKV, transport: PeerTransport
    ) -> dict:
        """Numbers for /metrics (keys: kvserver.server.metrics.NODE_METRICS); read per scrape."""
        status = node.raw.status()
        commit = status.hard_state.commit
        return {
            "raft_term": node.term,
            "raft_commit_index": commit,
            "raft_applied_index": node.applied,
            "raft_apply_lag_entries": commit - node.applied,
            "raft_has_leader": int(node.leader != 0),
            "raft_is_leader": int(node.is_leader),
            "raft_leader_changes": node.leader_changes,
            "raft_leader_changes_seen": node.leaders_seen,
            "raft_follower_lag_entries": {  # progress is the leader's only: {} on a follower
                f"{peer:x}": max(0, commit - pr.match)
                for peer, pr in status.progress.items()
                if peer != node.id
            },
            "proposals_committed": node.stats["proposals_applied"],
            "proposals_failed": node.stats["proposals_failed"],
            "proposals_pending": node.pending_proposals,
            "wal_fsync_duration_seconds": storage.fsync_seconds,
            "peer_send_failures": {
                f"{peer:x}": count for peer, count in transport.failures_by_peer.items()
            },
            "snapshot_fork_seconds": node.snapshot_fork_seconds,
            "snapshots_made": dict(node.snapshots_made),
            "store_revision": kv.store.revision,
            "store_db_size_bytes": kv.store.db_size_bytes,
            "store_compaction_pending_versions": kv.store.compaction_backlog,
            "quota_backend_bytes": kv.quota_backend_bytes,
            "alarm_active": {
                t.name: int(kv.alarms.is_active(t)) for t in (AlarmType.NOSPACE, AlarmType.CORRUPT)
            },
            **self.appends.stats(),
            **archive_member.stats(self.archive),
            **self.gc_pacer.stats(),
            **self.heap_trimmer.stats(),
            **self.loop_monitor.stats(),
            "snapshot_streams_refused": self.snapshot_gate.refused,
            **(self.disk_guard.stats() if self.disk_guard is not None else {}),
        }

    async def stop(self) -> None:
        """Clients first, then the raft loop, then peers, then the disk."""
        client_runners, peer_runners = self.runners[1:], self.runners[:1]
        self.gc_pacer.stop()
        await self.heap_trimmer.wait_idle()
        await self.loop_monitor.stop()
        for listener in self.client_listeners:
            listener.close()
        if self.grpc is not None:
            await self.grpc.stop()
        for runner in client_runners:
            await runner.cleanup()
        if self.disk_guard is not None:
            await self.disk_guard.stop()
        if self.membership is not None:
            await self.membership.stop()
        if self.kv is not None:
            await self.kv.stop()
        if self.node is not None:
            await self.node.stop()
        if self.transport is not None:
            await self.transport.stop()
        for runner in peer_runners:
            await runner.cleanup()
        archive_member.stop(self.archive)  # a last pass, before the WAL closes
        if self.storage is not None:
            self.storage.close()


def listening_socket(host: str | None, port: int) -> socket.socket:
    """A client URL's listening socket, for the front ends to accept on."""
    family = socket.AF_INET6 if host and ":" in host else socket.AF_INET
    return socket.create_server((host or "", port), family=family, backlog=1024)


def client_limits(cfg: ServerConfig) -> Http2Limits:
    """The budgets of one client connection, from the member's flags."""
    return Http2Limits(
        max_concurrent_streams=cfg.max_concurrent_streams,
        max_resets_per_s=float(cfg.client_max_resets_per_second),
        max_header_block_bytes=cfg.client_max_header_block_bytes,
        max_header_list_bytes=cfg.client_max_header_list_bytes,
        decode_cache_bytes=cfg.client_decode_cache_bytes,
        max_control_answers=cfg.client_max_control_answers,
        max_output_bytes=cfg.client_max_output_bytes,
        drain_timeout_s=cfg.client_drain_timeout_ms / 1000,
        max_input_bytes=cfg.client_max_input_bytes,
        idle_timeout_s=cfg.client_idle_timeout_ms / 1000,
        default_call_timeout_s=cfg.client_default_call_timeout_ms / 1000,
        max_running_calls=cfg.client_max_running_calls,
        max_connections=cfg.client_max_grpc_connections,
        max_connections_per_address=cfg.client_max_connections_per_address,
    )


def grpc_client_credentials(cfg: ServerConfig) -> grpc.ChannelCredentials | None:
    """This member's credentials for dialling another member's https client URL over gRPC
    (forwarding to the leader): its CA, certificate and key files. None without files
    (auto-TLS certificates are signed by no CA a gRPC channel could verify)."""
    if not (cfg.trusted_ca_file and cfg.cert_file and cfg.key_file):
        return None
    with open(cfg.trusted_ca_file, "rb") as ca, open(cfg.cert_file, "rb") as cert:
        roots, chain = ca.read(), cert.read()
    with open(cfg.key_file, "rb") as key:
        return grpc.ssl_channel_credentials(roots, key.read(), chain)


def failure_message(cfg: ServerConfig, member_id: int, failure: BaseException | None) -> str:
    """What a member whose raft loop stopped prints before it exits non-zero."""
    if is_disk_full(failure):
        return (
            f"raftkv: member {cfg.name} ({member_id:x}) stopped: the disk is full: {failure}. "
            f"Nothing acknowledged is lost (a write is acknowledged only once it is on "
            f"disk). Free space on the file system holding {cfg.data_dir} (files there that "
            f"are not raftkv's; raftkv itself keeps {cfg.max_snapshots} snapshots and "
            f"{cfg.max_wals} released WAL files, fewer with --max-snapshots/--max-wals) or "
            f"move the data dir to a larger disk, then start the member again."
        )
    if not isinstance(failure, CommitOutOfRangeError):
        return f"raftkv: the raft loop failed ({failure}; see the log above); exiting"
    peer_urls = ",".join(cfg.initial_advertise_peer_urls)
    return (
        f"raftkv: member {cfg.name} ({member_id:x}) lost raft log entries it had "
        f"acknowledged: the leader has committed index {failure.commit}, this member's log "
        f"ends at {failure.last_index}. Its data dir {cfg.data_dir} was truncated or "
        f"corrupted (a torn WAL tail repaired after a crash on a disk that lost written "
        f"data, an old backup, or a copied data dir). Rejoining with this log could lose "
        f"committed writes (the lost entries may have counted toward a commit quorum), so "
        f"the member stops, and it will stop again at every start. `raftkv wal repair` "
        f"cannot bring the entries back. Replace the member with a fresh data dir: on a "
        f"healthy member run `raftkv member remove {member_id:x}`, move {cfg.data_dir} "
        f"away, run `raftkv member add {cfg.name} --peer-urls {peer_urls}`, then start "
        f"this member again with --initial-cluster-state existing."
    )


async def serve(cfg: ServerConfig) -> None:
    member = Member(cfg)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    try:
        await member.start()
        node, membership = member.running()
        failed = asyncio.ensure_future(node.failed.wait())
        stopped = asyncio.ensure_future(stop.wait())
        removed = asyncio.ensure_future(membership.removed.wait())
        await asyncio.wait([failed, stopped, removed], return_when=asyncio.FIRST_COMPLETED)
        for fut in (failed, stopped, removed):
            fut.cancel()
        if node.failed.is_set():
            message = failure_message(cfg, member.member_id, node.failure)
            log.error("%s", message)
            raise SystemExit(message)
        if membership.removed.is_set():
            # A removed leader hands over first (the raft core steps down once the others
            # have its log); then stop serving, as etcd does.
            await membership.wait_handed_over(2 * cfg.election_timeout_ms / 1000)
            log.warning("raftkv: %s; stopping", REMOVED_MESSAGE)
            print(f"raftkv: {REMOVED_MESSAGE}", file=sys.stderr, flush=True)
    finally:
        await member.stop()


def run(cfg: ServerConfig) -> None:
    # The WAL writer thread needs the GIL right after its fsync returns; with the default
    # 5 ms switch interval it can wait that long behind the event loop serving HTTP.
    sys.setswitchinterval(float(os.environ.get("RAFTKV_SWITCH_INTERVAL_S", "0.0005")))
    # Client connections, WAL segments and peers all take file descriptors: use what the
    # hard limit allows (Go raises the soft limit for etcd at start).
    soft, _ = raise_nofile_limit()
    log.info("open-file limit: %d", soft)
    collect_young_less_often()
    run_main(serve(cfg), cfg.name)
