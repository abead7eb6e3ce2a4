"""Peer transport: raft messages between nodes over HTTP (aiohttp).

Contract:
- ``send(messages)`` never blocks and never raises: messages go to a bounded per-peer queue;
  when the queue is full the message is dropped and the peer reported unreachable, so raft
  falls back to probing that peer instead of this node growing memory.
- Each peer has one long-lived WebSocket stream (``GET /raft/stream``) carrying batches of
  messages in order (one WebSocket binary frame = one msgpack batch, see peer_codec). The
  stream reconnects with exponential backoff; while it is down, messages to that peer are
  dropped and reported unreachable. A stream the peer opens to this member ends the wait: a
  restarted peer is dialled at once (its listener opens with its own streams), not up to a
  full backoff after it came back.
- Snapshots (MsgSnap) travel on their own request, ``POST /raft/snapshot``, whose body is
  streamed in chunks: a 4-byte big-endian header length, the message encoded without snapshot
  data, then the data bytes. The outcome is reported back with ``on_snapshot_status``. The
  receiver writes the data to a spill file in ``spill_dir`` as it arrives (``snap.spill``)
  and hands on the message with the data mapped from it: a snapshot of hundreds of
  megabytes never sits in the heap.
- Every connection carries ``X-Raftkv-Cluster-Id``, ``X-Raftkv-From`` and ``X-Raftkv-To``.
  Who may talk to this member (etcd's rafthttp stream handler, in this order): another cluster
  is refused with 412; a member the registry knows as removed with 410; a sender that is not a
  current member with 404 ``sender not found`` (etcd: ``peerGetter.Get(from) == nil``); a
  connection meant for another member ID (``X-Raftkv-To``) with 412. "Current member" is the
  peer set, which ``set_peers`` keeps equal to the member registry. Stream requests and
  snapshot requests get the same checks; a stream whose sender stops being a member is closed.
- A registry that is behind. A member that was down while another was added does not know the
  newcomer, and can only learn it from the leader's log; if the newcomer leads, refusing it
  would leave this member behind for good (etcd names the case in its stream handler and gets
  around it because its pipeline handler takes any sender). So a refused sender that is not
  known as removed is looked up, in the background and rate-limited, with the members this
  member knows (``GET /raft/members`` on their peer URLs: the registry they replicated); if
  one of them lists it, it becomes a *vouched* peer (connected, accepted) until this member's
  own registry lists it (``set_peers``) or says it was removed. A forged ID is listed by no
  member, so it stays refused.
- Every decoded message is checked before raft sees it (``peer_validate.check_message``:
  addressed to this member, ``from`` equal to the stream's sender except for forwarded
  requests, bounded terms and indexes, consistent entries). A frame that does not decode or
  holds one bad message is dropped whole, logged at WARNING (rate-limited per sender), and its
  stream is closed (code 1008); nothing of it reaches raft. Nothing a peer sends can crash the
  node.
- No peer task ends silently: an unexpected error in a sender task is logged at ERROR with its
  traceback and the stream reconnects with backoff; a message that cannot be encoded is
  dropped (ERROR) and the rest of its batch still goes; a receiving stream that fails
  unexpectedly is logged at ERROR and closed (the peer reconnects).

Membership (``kvserver.membership.service``): ``set_peers({id: url})`` reconciles the peer set with the
member registry (a new member is connected, a removed one closed, a changed URL re-dialled;
incoming streams of a removed peer are closed too). Streams carry the sender's name and client
URLs (``X-Raftkv-Name``, ``X-Raftkv-Client-Urls``), kept in ``peer_attributes`` for the leader
to publish. A request from a member the registry knows as removed (``is_removed``) is refused
with 410 Gone; a stream refused with 410 tells this member it was removed (``on_removed``).
``GET /raft/members`` answers ``members_json()`` without a cluster check: a joining node asks
it for the cluster ID and its own member ID.

Disk health (``kvserver.server.disk_health``): ``GET /raft/disk`` answers ``disk_health()``
(this member's WAL fsync p99 and stall, a small JSON object) to members of the cluster, with
the same header checks as a stream. ``ask_disk_health(peer)`` asks a peer for its own; a
leader whose disk is slow does, to pick a follower to hand leadership to. A query rather
than a field in the raft messages: the stream's frames stay raft's, members of earlier
versions answer 404 (and are never picked), and a healthy cluster sends nothing for it.
"""

import asyncio
import dataclasses
import logging
import time
from collections import deque
from collections.abc import AsyncIterator, Callable, Iterable

import aiohttp
from aiohttp import web

from kvserver.rafthttp.codec import (
    PeerMessageError,
    decode_batch,
    decode_message,
    encode_batch,
    encode_message,
)
from kvserver.rafthttp.validate import check_message
from raft import Message, MessageType
from snap.spill import drop_resident_pages, spill_chunks

log = logging.getLogger(__name__)

CLUSTER_HEADER = "X-Raftkv-Cluster-Id"
FROM_HEADER = "X-Raftkv-From"
TO_HEADER = "X-Raftkv-To"
NAME_HEADER = "X-Raftkv-Name"
CLIENT_URLS_HEADER = "X-Raftkv-Client-Urls"
MEMBERS_PATH = "/raft/members"
STREAM_PATH = "/raft/stream"
SNAPSHOT_PATH = "/raft/snapshot"
DISK_PATH = "/raft/disk"


@dataclasses.dataclass(frozen=True, slots=True)
class TransportLimits:
    queue_messages: int = 4096  # per peer, before messages are dropped
    batch_bytes: int = 4 << 20  # stop adding messages to a batch past this size
    frame_bytes: int = 64 << 20  # largest WebSocket frame accepted
    snapshot_bytes: int = 1 << 30  # largest snapshot accepted
    snapshot_chunk_bytes: int = 256 << 10
    backoff_min_s: float = 0.05
    backoff_max_s: float = 1.0
    heartbeat_s: float = 2.0  # WebSocket ping: detects a dead peer connection
    close_timeout_s: float = 1.0  # at stop: how long an incoming stream's close may wait
    warn_interval_s: float = 10.0  # one WARNING per sender and kind of refusal per interval
    vouch_interval_s: float = 2.0  # an unknown sender is looked up at most this often
    vouch_timeout_s: float = 2.0  # per member asked


OnMessages = Callable[[list[Message]], None]


class PeerTransport:
    def __init__(
        self,
        *,
        local_id: int,
        cluster_id: int,
        on_messages: OnMessages,
        on_unreachable: Callable[[int], None],
        on_snapshot_status: Callable[[int, bool], None],
        limits: TransportLimits | None = None,
        name: str = "",
        client_urls: tuple[str, ...] = (),
        is_removed: Callable[[int], bool] | None = None,
        on_removed: Callable[[], None] | None = None,
        members_json: Callable[[], dict] | None = None,
        ssl_context=None,
        spill_dir: str | None = None,
        disk_health: Callable[[], dict] | None = None,
    ):
        self.local_id = local_id
        self.spill_dir = spill_dir  # received snapshots are spilled here (None: the temp dir)
        # Peer TLS (kvserver.tls.dial_context): the peer CA and this member's certificate as
        # a client certificate, for https peer URLs; None: default verification.
        self._ssl = True if ssl_context is None else ssl_context
        self.cluster_id = cluster_id
        self._on_messages = on_messages
        self._on_unreachable = on_unreachable
        self._on_snapshot_status = on_snapshot_status
        self.limits = limits or TransportLimits()
        self.name = name
        self.client_urls = tuple(client_urls)
        self._is_removed = is_removed or (lambda peer_id: False)
        self._on_removed = on_removed
        self._members_json = members_json
        self._disk_health = disk_health
        self.peer_attributes: dict[int, tuple[str, tuple[str, ...]]] = {}
        self._incoming_by_peer: dict[int, set[web.WebSocketResponse]] = {}
        self._ever_connected: set[int] = set()
        self._peers: dict[int, _PeerSender] = {}
        self._session: aiohttp.ClientSession | None = None
        self._snapshot_tasks: set[asyncio.Task] = set()
        self._incoming: set[web.WebSocketResponse] = set()
        self._closing = False
        self.dropped_messages = 0
        self.failures_by_peer: dict[int, int] = {}
        self.refused_by_peer: dict[int, int] = {}  # refused connections and bad frames
        self._warned: dict[tuple[int, str], tuple[float, int]] = {}
        self._vouched: dict[int, str] = {}  # id -> peer URL, see the docstring
        self._vouch_asked: dict[int, float] = {}  # id -> when it was last looked up
        self._vouch_task: asyncio.Task | None = None

    # --- lifecycle -----------------------------------------------------------------------

    async def start(self) -> None:
        self._session = aiohttp.ClientSession(
            timeout=aiohttp.ClientTimeout(total=None, connect=2.0),
            connector=aiohttp.TCPConnector(limit=0, ssl=self._ssl),
        )

    def _client(self) -> aiohttp.ClientSession:
        """The session for dialing peers (made by ``start``)."""
        if self._session is None:
            raise RuntimeError("the peer transport is not started")
        return self._session

    async def stop(self) -> None:
        self._closing = True  # refuse new streams: peers reconnect at once otherwise
        for peer in list(self._peers.values()):
            await peer.stop()
        self._peers.clear()
        for task in list(self._snapshot_tasks):
            task.cancel()
        if self._vouch_task is not None:
            self._vouch_task.cancel()
        # Else the HTTP server waits for them to end. Closed together, each bounded by
        # close_timeout_s: a peer that does not answer the close frame must not hold up
        # this member's stop (aiohttp's default close wait is 10 s per stream).
        await asyncio.gather(*(ws.close() for ws in list(self._incoming)), return_exceptions=True)
        if self._session is not None:
            await self._session.close()

    def add_peer(self, peer_id: int, url: str) -> None:
        if peer_id == self.local_id or peer_id in self._peers:
            return
        sender = _PeerSender(self, peer_id, url.rstrip("/"))
        self._peers[peer_id] = sender
        sender.start()

    def remove_peer(self, peer_id: int) -> None:
        sender = self._peers.pop(peer_id, None)
        if sender is not None:
            asyncio.get_running_loop().create_task(sender.stop())
        for ws in list(self._incoming_by_peer.pop(peer_id, ())):
            asyncio.get_running_loop().create_task(ws.close())
        self.peer_attributes.pop(peer_id, None)

    def set_peers(self, urls: dict[int, str]) -> None:
        """Make the peer set ``urls`` (id -> peer URL): add, re-point, remove. Vouched peers
        stay until ``urls`` lists them or the registry knows them as removed."""
        if self._closing:
            return
        for peer_id in list(self._vouched):
            if peer_id in urls or self._is_removed(peer_id) or peer_id == self.local_id:
                del self._vouched[peer_id]
        urls = {**self._vouched, **urls}
        for peer_id in [p for p in self._peers if p not in urls]:
            self.remove_peer(peer_id)
        for peer_id, url in urls.items():
            sender = self._peers.get(peer_id)
            if sender is not None and sender.url != url.rstrip("/"):
                self._peers.pop(peer_id)
                asyncio.get_running_loop().create_task(sender.stop())
            self.add_peer(peer_id, url)

    def is_connected(self, peer_id: int) -> bool:
        sender = self._peers.get(peer_id)
        return sender is not None and sender.connected

    def ever_connected(self, peer_id: int) -> bool:
        return peer_id in self._ever_connected

    def peer_url(self, peer_id: int) -> str | None:
        sender = self._peers.get(peer_id)
        return sender.url if sender else None

    # --- sending -------------------------------------------------------------------------

    def send(self, messages: Iterable[Message]) -> None:
        for m in messages:
            peer = self._peers.get(m.to)
            if peer is None:
                continue  # removed or unknown peer: raft will stop sending to it
            if m.type == MessageType.MsgSnap:
                task = asyncio.get_running_loop().create_task(self._send_snapshot(peer, m))
                self._snapshot_tasks.add(task)
                task.add_done_callback(self._snapshot_tasks.discard)
            else:
                peer.enqueue(m)

    async def _send_snapshot(self, peer: "_PeerSender", m: Message) -> None:
        snapshot = m.snapshot
        assert snapshot is not None  # send() hands only MsgSnap here, which carries one
        data = snapshot.data
        header = encode_message(
            dataclasses.replace(m, snapshot=dataclasses.replace(snapshot, data=b""))
        )
        chunk = self.limits.snapshot_chunk_bytes

        async def body():
            yield len(header).to_bytes(4, "big") + header
            view = memoryview(data)
            for start in range(0, len(view), chunk):
                yield bytes(view[start : start + chunk])

        failed = True
        try:
            async with self._client().post(
                peer.url + SNAPSHOT_PATH, data=body(), headers=self._headers(m.to)
            ) as resp:
                failed = resp.status != 204
                if failed:
                    log.warning(
                        "snapshot to %x refused: %s %s", m.to, resp.status, await resp.text()
                    )
        except asyncio.CancelledError:
            raise
        except (TimeoutError, aiohttp.ClientError, OSError) as exc:
            log.warning("snapshot to %x failed: %s", m.to, exc)
        except Exception:  # a bug: say so, and let raft retry the snapshot later
            log.exception("snapshot to %x failed unexpectedly", m.to)
        drop_resident_pages(data)  # the kept snapshot's pages this send read
        self._on_snapshot_status(m.to, failed)

    def _headers(self, to: int) -> dict[str, str]:
        return {
            CLUSTER_HEADER: str(self.cluster_id),
            FROM_HEADER: str(self.local_id),
            TO_HEADER: str(to),
            NAME_HEADER: self.name,
            CLIENT_URLS_HEADER: ",".join(self.client_urls),
        }

    def _warn(self, sender: int, kind: str, text: str, *args) -> None:
        """WARNING about ``sender``, at most one per ``kind`` per ``warn_interval_s``: a
        peer that keeps sending bad frames or reconnecting must not flood the log."""
        now = time.monotonic()
        last, suppressed = self._warned.get((sender, kind), (-float("inf"), 0))
        if now - last < self.limits.warn_interval_s:
            self._warned[(sender, kind)] = (last, suppressed + 1)
            return
        if len(self._warned) > 1024:  # bounded: senders can be any 64-bit number
            self._warned.clear()
        self._warned[(sender, kind)] = (now, 0)
        if suppressed:
            text += f" ({suppressed} more like it not logged)"
        log.warning(text, *args)

    def _refuse(self, sender: int, kind: str, text: str, *args) -> None:
        """Count and log (rate-limited) a refused connection or frame from ``sender``."""
        self.refused_by_peer[sender] = self.refused_by_peer.get(sender, 0) + 1
        self._warn(sender, kind, text, *args)

    def is_member(self, peer_id: int) -> bool:
        """A current member other than this one (the peer set follows the registry)."""
        return peer_id in self._peers

    # --- receiving -----------------------------------------------------------------------

    def routes(self) -> list[web.RouteDef]:
        return [
            web.get(STREAM_PATH, self._handle_stream),
            web.post(SNAPSHOT_PATH, self._handle_snapshot),
            web.get(MEMBERS_PATH, self._handle_members),
            web.get(DISK_PATH, self._handle_disk),
        ]

    async def _handle_disk(self, request: web.Request) -> web.Response:
        self._check_headers(request)
        if self._disk_health is None:
            raise web.HTTPNotFound()
        return web.json_response(self._disk_health())

    async def ask_disk_health(self, peer_id: int) -> object:
        """The JSON a peer answers on ``GET /raft/disk`` (its disk's health); raises
        ``LookupError`` for a peer not in the peer set, ``aiohttp.ClientError`` for an answer
        other than 200. The caller bounds the wait and checks the answer."""
        peer = self._peers.get(peer_id)
        if peer is None:
            raise LookupError(f"{peer_id:x} is not a peer")
        async with self._client().get(peer.url + DISK_PATH, headers=self._headers(peer_id)) as resp:
            resp.raise_for_status()
            return await resp.json()

    async def _handle_members(self, request: web.Request) -> web.Response:
        if self._members_json is None:
            raise web.HTTPNotFound()
        return web.json_response(self._members_json())

    def _check_headers(self, request: web.Request) -> int:
        """The sender's member ID, or an HTTP error in etcd's order (module docstring)."""
        try:
            cluster = int(request.headers.get(CLUSTER_HEADER, ""))
            sender = int(request.headers.get(FROM_HEADER, ""))
            # Absent in members of earlier versions; every message's ``to`` is checked anyway.
            to = int(request.headers.get(TO_HEADER, self.local_id))
        except ValueError:
            raise web.HTTPBadRequest(text="missing or bad peer headers") from None
        if cluster != self.cluster_id:
            raise web.HTTPPreconditionFailed(
                text=f"cluster id mismatch: local {self.cluster_id:x}, remote {cluster:x}"
            )
        if self._is_removed(sender):
            raise web.HTTPGone(text="the member has been permanently removed from the cluster")
        if not self.is_member(sender):
            # etcd: a member of another cluster with a colliding ID, an impostor, or a member
            # added while this one was down: looked up with the members we know (docstring);
            # the sender retries with backoff.
            self._vouch_later(sender)
            self._refuse(
                sender,
                "404",
                "refused %s from %x: sender not found (not a member of cluster %x)",
                request.path,
                sender,
                self.cluster_id,
            )
            raise web.HTTPNotFound(text="sender not found")
        if to != self.local_id:
            self._refuse(
                sender,
                "to",
                "refused %s from %x: meant for member %x, this is %x",
                request.path,
                sender,
                to,
                self.local_id,
            )
            raise web.HTTPPreconditionFailed(
                text=f"to field mismatch: local {self.local_id:x}, remote {to:x}"
            )
        return sender

    async def _handle_stream(self, request: web.Request) -> web.StreamResponse:
        sender = self._check_headers(request)
        if self._closing:
            raise web.HTTPServiceUnavailable(text="member is stopping")
        ws = web.WebSocketResponse(
            max_msg_size=self.limits.frame_bytes,
            heartbeat=self.limits.heartbeat_s,
            timeout=self.limits.close_timeout_s,
        )
        await ws.prepare(request)
        peer = self._peers.get(sender)
        if peer is not None:
            peer.peer_is_back()
        self._incoming.add(ws)
        by_peer = self._incoming_by_peer.setdefault(sender, set())
        by_peer.add(ws)
        name = request.headers.get(NAME_HEADER, "")
        urls = tuple(u for u in request.headers.get(CLIENT_URLS_HEADER, "").split(",") if u)
        if name:
            self.peer_attributes[sender] = (name, urls)
        code: int = aiohttp.WSCloseCode.OK
        try:
            code = await self._read_stream(ws, sender)
        except asyncio.CancelledError:
            raise
        except Exception:  # a bug: say so; the peer reconnects
            log.exception("stream from peer %x failed; closing it", sender)
            code = aiohttp.WSCloseCode.INTERNAL_ERROR
        finally:
            self._incoming.discard(ws)
            by_peer.discard(ws)
            await ws.close(code=code)
            if not by_peer and not self._closing:
                # The peer's last stream to us ended: when it was our leader, its process most
                # likely died (the kernel closed its sockets), and raft campaigns sooner
                # instead of waiting out a full randomized election timeout.
                self._on_unreachable(sender)
        return ws

    def _vouch_later(self, sender: int) -> None:
        now = time.monotonic()
        if (
            sender == self.local_id
            or self._closing
            or (self._vouch_task is not None and not self._vouch_task.done())
            or now - self._vouch_asked.get(sender, -float("inf")) < self.limits.vouch_interval_s
        ):
            return
        if len(self._vouch_asked) > 1024:  # bounded: senders can be any 64-bit number
            self._vouch_asked.clear()
        self._vouch_asked[sender] = now
        self._vouch_task = asyncio.get_running_loop().create_task(self._vouch(sender))

    async def _vouch(self, sender: int) -> None:
        """Ask the members we know whether ``sender`` is a member; if one lists it (with a
        peer URL), connect to it and accept its streams."""
        for peer_id, peer in list(self._peers.items()):
            if peer_id == sender or peer_id in self._vouched:
                continue
            try:
                async with asyncio.timeout(self.limits.vouch_timeout_s):
                    async with self._client().get(peer.url + MEMBERS_PATH) as resp:
                        if resp.status != 200:
                            continue
                        body = await resp.json()
                if int(body["cluster_id"]) != self.cluster_id:
                    continue
                urls = next(
                    (m["peerURLs"] for m in body["members"] if int(m["id"]) == sender), None
                )
            except asyncio.CancelledError:
                raise
            except (
                TimeoutError,
                aiohttp.ClientError,
                OSError,
                ValueError,
                KeyError,
                TypeError,
            ) as exc:
                log.debug("asking %x about peer %x: %s", peer_id, sender, exc)
                continue
            if (
                urls
                and isinstance(urls[0], str)
                and not self._closing
                and not self._is_removed(sender)
                and not self.is_member(sender)
            ):
                log.info(
                    "accepting peer %x: member %x lists it (this member's registry is behind)",
                    sender,
                    peer_id,
                )
                self._vouched[sender] = urls[0]
                self.add_peer(sender, urls[0])
                return
            if urls is not None or self.is_member(sender):
                return

    def _check_frame(self, data: bytes, sender: int) -> list:
        """The messages of one stream frame, all checked; ``PeerMessageError`` otherwise."""
        if not self.is_member(sender):
            raise PeerMessageError("the sender is no longer a member")
        batch = decode_batch(data)
        for m in batch:
            check_message(m, local_id=self.local_id, sender=sender, is_member=self._is_peer)
        return batch

    def _is_peer(self, member_id: int) -> bool:
        return member_id == self.local_id or self.is_member(member_id)

    async def _read_stream(self, ws: web.WebSocketResponse, sender: int) -> int:
        """Deliver the stream's frames; the close code to answer with when it ends."""
        async for frame in ws:
            if frame.type != aiohttp.WSMsgType.BINARY:
                break
            try:
                batch = self._check_frame(frame.data, sender)
            except PeerMessageError as exc:
                self._refuse(
                    sender,
                    "frame",
                    "dropped a frame from peer %x and closed its stream: %s",
                    sender,
                    exc,
                )
                return aiohttp.WSCloseCode.POLICY_VIOLATION
            if batch:
                self._on_messages(batch)
        return aiohttp.WSCloseCode.OK

    async def _handle_snapshot(self, request: web.Request) -> web.Response:
        sender = self._check_headers(request)
        limit = self.limits.snapshot_bytes
        try:
            size = int.from_bytes(await request.content.readexactly(4), "big")
            if size > self.limits.frame_bytes:
                raise web.HTTPRequestEntityTooLarge(
                    max_size=self.limits.frame_bytes, actual_size=size
                )
            m = decode_message(await request.content.readexactly(size))
            if m.type != MessageType.MsgSnap:
                raise web.HTTPBadRequest(text="snapshot request does not carry a MsgSnap")
            check_message(m, local_id=self.local_id, sender=sender, is_member=self._is_peer)
            data = await self._receive_snapshot_data(request, limit)
        except asyncio.IncompleteReadError:
            raise web.HTTPBadRequest(text="snapshot body ended early") from None
        except PeerMessageError as exc:
            self._refuse(sender, "snapshot", "refused a snapshot from peer %x: %s", sender, exc)
            raise web.HTTPBadRequest(text=str(exc)) from None
        snapshot = m.snapshot
        assert snapshot is not None  # check_message: a MsgSnap carries a snapshot
        # the data is a mapped buffer where raft's type says bytes (the storage keeps such too)
        received = dataclasses.replace(snapshot, data=data)  # type: ignore[arg-type]
        self._on_messages([dataclasses.replace(m, snapshot=received)])
        return web.Response(status=204)

    async def _receive_snapshot_data(self, request: web.Request, limit: int) -> memoryview:
        """The rest of the body, spilled to a file as it arrives and mapped."""

        async def body() -> AsyncIterator[bytes]:
            received = 0
            async for chunk in request.content.iter_chunked(1 << 16):
                received += len(chunk)
                if received > limit:
                    raise web.HTTPRequestEntityTooLarge(max_size=limit, actual_size=received)
                yield chunk

        return await spill_chunks(body(), self.spill_dir)


class _PeerSender:
    """One peer's queue and stream task."""

    def __init__(self, transport: PeerTransport, peer_id: int, url: str):
        self.transport = transport
        self.peer_id = peer_id
        self.url = url
        self.queue: deque[Message] = deque()
        self.wakeup = asyncio.Event()
        self.connected = False
        self.task: asyncio.Task | None = None
        # Set when the peer opened a stream to us while ours to it was down: it is back, so
        # the reconnect does not wait out the rest of its backoff.
        self.redial = asyncio.Event()
        self.failed_dials = 0  # streams that could not be opened, or ended (tests read it)

    def peer_is_back(self) -> None:
        if not self.connected:
            self.redial.set()

    def start(self) -> None:
        self.task = asyncio.get_running_loop().create_task(self._run())

    async def stop(self) -> None:
        if self.task is not None:
            self.task.cancel()
            try:
                await self.task
            except (asyncio.CancelledError, Exception):
                pass

    def enqueue(self, m: Message) -> None:
        t = self.transport
        if not self.connected or len(self.queue) >= t.limits.queue_messages:
            t.dropped_messages += 1
            t.failures_by_peer[self.peer_id] = t.failures_by_peer.get(self.peer_id, 0) + 1
            t._on_unreachable(self.peer_id)
            return
        self.queue.append(m)
        self.wakeup.set()

    async def _run(self) -> None:
        t = self.transport
        backoff = t.limits.backoff_min_s
        while True:
            try:
                async with t._client().ws_connect(
                    self.url + STREAM_PATH,
                    headers=t._headers(self.peer_id),
                    heartbeat=t.limits.heartbeat_s,
                    max_msg_size=t.limits.frame_bytes,
                    autoclose=True,
                ) as ws:
                    self.connected = True
                    self.redial.clear()
                    t._ever_connected.add(self.peer_id)
                    backoff = t.limits.backoff_min_s
                    await self._pump(ws)
            except asyncio.CancelledError:
                raise
            except aiohttp.WSServerHandshakeError as exc:
                log.debug("stream to %x: %s", self.peer_id, exc)
                if exc.status == 410 and t._on_removed is not None:
                    t._on_removed()  # the peer knows this member as removed
                elif exc.status in (404, 412):
                    t._warn(
                        self.peer_id,
                        f"out-{exc.status}",
                        "peer %x refuses this "
                        "member's stream (HTTP %s: it does not know this member as a "
                        "member yet, or not at this URL); retrying",
                        self.peer_id,
                        exc.status,
                    )
            except (TimeoutError, aiohttp.ClientError, OSError) as exc:
                log.debug("stream to %x: %s", self.peer_id, exc)
            except Exception:  # a bug: never end this task silently; reconnect
                log.exception("stream to peer %x failed unexpectedly; reconnecting", self.peer_id)
            self.connected = False
            self.failed_dials += 1
            if self.queue:
                t.failures_by_peer[self.peer_id] = t.failures_by_peer.get(self.peer_id, 0) + len(
                    self.queue
                )
                self.queue.clear()
                t._on_unreachable(self.peer_id)
            try:
                await asyncio.wait_for(self.redial.wait(), backoff)
            except TimeoutError:
                backoff = min(backoff * 2, t.limits.backoff_max_s)
            else:  # the peer is back (it dialled us): from the shortest backoff again
                self.redial.clear()
                backoff = t.limits.backoff_min_s

    async def _pump(self, ws: aiohttp.ClientWebSocketResponse) -> None:
        limit = self.transport.limits.batch_bytes
        while not ws.closed:
            if not self.queue:
                # Plain wait (no timeout wrapper: each layer costs a loop iteration on the
                # hot path). A dead connection is noticed by the WebSocket heartbeat, which
                # closes it, or by the next send, which fails; both end in a reconnect.
                self.wakeup.clear()
                await self.wakeup.wait()
                continue
            batch, size = [], 0
            while self.queue and size < limit:
                m = self.queue.popleft()
                batch.append(m)
                size += 64 + sum(len(e.data) for e in m.entries)
            frame: bytes | None
            try:
                frame = encode_batch(batch)
            except Exception:  # a bug (e.g. a value msgpack cannot hold): drop only culprits
                frame = self._encode_each(batch)
            if frame is not None:
                await ws.send_bytes(frame)

    def _encode_each(self, batch: list[Message]) -> bytes | None:
        good = []
        for m in batch:
            try:
                encode_message(m)
            except Exception:
                log.exception(
                    "dropped a message to peer %x that cannot be encoded: %s", self.peer_id, m
                )
                t = self.transport
                t.dropped_messages += 1
                t.failures_by_peer[self.peer_id] = t.failures_by_peer.get(self.peer_id, 0) + 1
            else:
                good.append(m)
        return encode_batch(good) if good else None
