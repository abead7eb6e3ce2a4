"""Server configuration: etcd-style flags, ``RAFTKV_*`` environment variables, defaults.

Precedence: command-line flag > environment variable > default. Every flag ``--foo-bar``
has the environment twin ``RAFTKV_FOO_BAR``. With no flags at all, ``raftkv serve`` runs a
one-node store in ``./raftkv-data`` with clients on 127.0.0.1:2379 and peers on :2380.
"""

import argparse
import os
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlsplit

from kvserver.kvpb.member import Member
from kvserver.membership.identity import ClusterConfigError, check_url, parse_initial_cluster
from kvserver.server.compactor import AutoCompaction
from kvserver.server.quota import effective_quota

DEFAULT_CLIENT_URL = "http://127.0.0.1:2379"
DEFAULT_PEER_URL = "http://127.0.0.1:2380"
MAX_GRPC_FRONTENDS = 64


@dataclass(frozen=True)
class ServerConfig:
    name: str = "default"
    data_dir: str = "raftkv-data"
    listen_client_urls: tuple[str, ...] = (DEFAULT_CLIENT_URL,)
    advertise_client_urls: tuple[str, ...] = (DEFAULT_CLIENT_URL,)
    listen_peer_urls: tuple[str, ...] = (DEFAULT_PEER_URL,)
    initial_advertise_peer_urls: tuple[str, ...] = (DEFAULT_PEER_URL,)
    initial_cluster: str = ""
    initial_cluster_state: str = "new"
    initial_cluster_token: str = "raftkv-cluster"
    heartbeat_interval_ms: int = 100
    election_timeout_ms: int = 1000
    snapshot_count: int = 100_000  # etcd 3.4's default
    # ... or this many bytes of applied entries, whichever comes first: bounds a restart's
    # replay of the WAL after the newest snapshot (0: entries only, as etcd)
    snapshot_bytes: int = 64 * 1024 * 1024
    snapshot_catchup_entries: int = 5000
    # ... and more, as long as what is kept totals at most this (a follower that was down a
    # while then catches up from the log, not through a snapshot of the whole store)
    snapshot_catchup_bytes: int = 64 * 1024 * 1024
    snapshot_in_child: bool = True  # snapshots made by a forked child (snap.forked)
    snapshot_incremental: bool = True  # continue the previous snapshot when no compaction ran
    max_snapshots: int = 5
    max_wals: int = 5
    max_request_bytes: int = 1536 * 1024
    # processes that serve clients' gRPC connections (HTTP/2) on other cores; 0: the member
    # serves them on its own loop (kvserver.api.grpc.frontends). `raftkv serve` defaults to
    # "auto" (CLIENT_FRONTENDS_AUTO: one per core beyond the first, at least one); a config
    # built in code (embedding, in-process tests) keeps the one-process member.
    grpc_frontends: int = 0
    # What one client may make a member hold (kvserver.api.grpc.budgets, docs/operations.md)
    max_concurrent_streams: int = 1000
    client_max_resets_per_second: int = 200
    client_max_header_block_bytes: int = 256 * 1024
    client_max_header_list_bytes: int = 64 * 1024
    client_decode_cache_bytes: int = 64 * 1024
    client_max_control_answers: int = 1000
    client_max_output_bytes: int = 8 * 1024 * 1024
    client_drain_timeout_ms: int = 30_000
    client_max_input_bytes: int = 16 * 1024 * 1024
    client_idle_timeout_ms: int = 300_000
    client_default_call_timeout_ms: int = 60_000
    client_max_running_calls: int = 32
    client_max_grpc_connections: int = 10_000
    client_max_connections_per_address: int = 1000
    frontend_max_calls: int = 4096
    max_snapshot_streams: int = 2  # Maintenance.Snapshot streams running at once
    wal_sync: str = "always"
    pre_vote: bool = True
    auto_compaction_mode: str = "periodic"  # etcd's flags; retention "0" = disabled
    auto_compaction_retention: str = "0"
    auto_compaction_check_interval: str = "5m"  # revision mode's check period (etcd: 5 min)
    quota_backend_bytes: int = 0  # 0 = etcd's default, 2 GiB (kvserver.server.quota)
    archive_url: str = ""  # kvserver.archive: "" = no continuous archive
    archive_retention: int = 0  # archived snapshots kept (0 = all)
    archive_interval_ms: int = 1000  # between two archive passes (the loss window)
    archive_options: str = ""  # fsspec options: key=value,key=value
    ui_write: bool = False  # the dashboard (/ui/) may put, delete and move the leader
    # TLS, etcd's flags (kvserver.tls): clients ...
    cert_file: str = ""
    key_file: str = ""
    trusted_ca_file: str = ""
    client_cert_auth: bool = False
    auto_tls: bool = False
    # ... and peers
    peer_cert_file: str = ""
    peer_key_file: str = ""
    peer_trusted_ca_file: str = ""
    peer_client_cert_auth: bool = False
    peer_auto_tls: bool = False
    # A leader whose WAL fsyncs turn slow hands leadership to a follower whose disk is
    # healthy; a stalled fsync makes /health false (kvserver.server.disk_health).
    slow_disk_transfer: bool = True
    slow_disk_fsync_threshold_ms: int = 250
    slow_disk_window_ms: int = 5000
    slow_disk_transfer_interval_ms: int = 60_000
    disk_stall_timeout_ms: int = 10_000
    members: tuple[Member, ...] = field(default=(), compare=False)

    @property
    def election_ticks(self) -> int:
        return max(2, self.election_timeout_ms // self.heartbeat_interval_ms)

    @property
    def auto_compaction(self) -> AutoCompaction:
        """The parsed auto-compaction flags (ValueError if malformed)."""
        return AutoCompaction.parse(
            self.auto_compaction_mode,
            self.auto_compaction_retention,
            self.auto_compaction_check_interval,
        )

    @property
    def quota_bytes(self) -> int:
        """The space quota in effect: ``--quota-backend-bytes``, 0 meaning 2 GiB."""
        return effective_quota(self.quota_backend_bytes)

    @property
    def member_dir(self) -> str:
        return os.path.join(self.data_dir, "member")

    @property
    def wal_dir(self) -> str:
        return os.path.join(self.member_dir, "wal")

    @property
    def snap_dir(self) -> str:
        return os.path.join(self.member_dir, "snap")

    def local_member(self) -> Member:
        for m in self.members:
            if m.name == self.name:
                return m
        raise ClusterConfigError(f"--name {self.name!r} is not in --initial-cluster")


# (flag, field, type, help). Types: "str", "urls", "int", "bool".
_FLAGS = (
    ("--name", "name", "str", "human-readable name of this member"),
    ("--data-dir", "data_dir", "str", "path to the data directory"),
    ("--listen-client-urls", "listen_client_urls", "urls", "URLs to listen on for clients"),
    (
        "--advertise-client-urls",
        "advertise_client_urls",
        "urls",
        "client URLs advertised to the cluster",
    ),
    ("--listen-peer-urls", "listen_peer_urls", "urls", "URLs to listen on for peers"),
    (
        "--initial-advertise-peer-urls",
        "initial_advertise_peer_urls",
        "urls",
        "this member's peer URLs, advertised to the cluster",
    ),
    (
        "--initial-cluster",
        "initial_cluster",
        "str",
        "initial cluster configuration: name=peer-url,...",
    ),
    ("--initial-cluster-state", "initial_cluster_state", "str", "new or existing"),
    (
        "--initial-cluster-token",
        "initial_cluster_token",
        "str",
        "cluster token: different clusters get different IDs",
    ),
    ("--heartbeat-interval", "heartbeat_interval_ms", "int", "heartbeat interval (ms)"),
    ("--election-timeout", "election_timeout_ms", "int", "election timeout (ms)"),
    (
        "--snapshot-count",
        "snapshot_count",
        "int",
        "applied entries between two snapshots (each member up to a quarter more, by its ID)",
    ),
    (
        "--snapshot-bytes",
        "snapshot_bytes",
        "int",
        "also snapshot after this many bytes of applied entries, whichever comes first: "
        "bounds the WAL a restart replays (0 = entries only)",
    ),
    (
        "--snapshot-catchup-entries",
        "snapshot_catchup_entries",
        "int",
        "entries kept after a snapshot for slow followers",
    ),
    (
        "--snapshot-catchup-bytes",
        "snapshot_catchup_bytes",
        "int",
        "keep more entries after a snapshot while they total at most this many bytes",
    ),
    (
        "--snapshot-in-child",
        "snapshot_in_child",
        "bool",
        "make snapshots in a forked child, in the background, while the member goes on "
        "(Linux only); false: on the member's event loop, a step at a time",
    ),
    (
        "--snapshot-incremental",
        "snapshot_incremental",
        "bool",
        "when no compaction ran since the previous snapshot, make the next one from its file "
        "and the changes since, without a fork; false: every snapshot serializes the store",
    ),
    ("--max-snapshots", "max_snapshots", "int", "snapshot files kept (0 = unlimited)"),
    ("--max-wals", "max_wals", "int", "released WAL files kept (0 = unlimited)"),
    ("--max-request-bytes", "max_request_bytes", "int", "largest client request body"),
    (
        "--client-frontends",
        "grpc_frontends",
        "frontends",
        "front-end processes that serve the gRPC connections of plain-TCP client URLs, so the "
        "HTTP/2 work runs on other cores: N, or auto (one per core beyond the first, at least "
        "one; what `raftkv serve` uses); 0 = on the member's own loop",
    ),
    ("--grpc-frontends", "grpc_frontends", "frontends", "the old name of --client-frontends"),
    (
        "--max-concurrent-streams",
        "max_concurrent_streams",
        "int",
        "HTTP/2 streams (gRPC calls) one client connection may have open",
    ),
    (
        "--client-max-resets-per-second",
        "client_max_resets_per_second",
        "int",
        "stream resets a second one connection may send (rapid reset: GOAWAY)",
    ),
    (
        "--client-max-header-block-bytes",
        "client_max_header_block_bytes",
        "int",
        "bytes of one HTTP/2 header block with its CONTINUATIONs, before decoding",
    ),
    (
        "--client-max-header-list-bytes",
        "client_max_header_list_bytes",
        "int",
        "decoded bytes of one header list (RFC 7541's size)",
    ),
    (
        "--client-decode-cache-bytes",
        "client_decode_cache_bytes",
        "int",
        "bytes of decoded header blocks cached per connection",
    ),
    (
        "--client-max-control-answers",
        "client_max_control_answers",
        "int",
        "SETTINGS and PING answers queued for a client that does not read them",
    ),
    (
        "--client-max-output-bytes",
        "client_max_output_bytes",
        "int",
        "answer bytes buffered per connection: above it no call starts and, if the socket "
        "is full, nothing is read",
    ),
    (
        "--client-drain-timeout-ms",
        "client_drain_timeout_ms",
        "int",
        "a connection over its output budget that reads nothing this long is closed",
    ),
    (
        "--client-max-input-bytes",
        "client_max_input_bytes",
        "int",
        "request bytes buffered per connection (its HTTP/2 receive window)",
    ),
    (
        "--client-idle-timeout-ms",
        "client_idle_timeout_ms",
        "int",
        "a gRPC connection with no call open this long gets GOAWAY",
    ),
    (
        "--client-default-call-timeout-ms",
        "client_default_call_timeout_ms",
        "int",
        "the deadline of a unary gRPC call sent without one",
    ),
    (
        "--client-max-running-calls",
        "client_max_running_calls",
        "int",
        "calls of one connection that run at once (the others wait their turn)",
    ),
    (
        "--client-max-grpc-connections",
        "client_max_grpc_connections",
        "int",
        "gRPC connections one process (a front end, or the member) serves",
    ),
    (
        "--client-max-connections-per-address",
        "client_max_connections_per_address",
        "int",
        "gRPC connections one process serves from one client IP address",
    ),
    (
        "--max-snapshot-streams",
        "max_snapshot_streams",
        "int",
        "snapshot streams (Maintenance.Snapshot, either dialect) that run at once; more are "
        "refused with RESOURCE_EXHAUSTED",
    ),
    (
        "--frontend-max-calls",
        "frontend_max_calls",
        "int",
        "calls one front end may have in flight at its member (more: RESOURCE_EXHAUSTED)",
    ),
    (
        "--wal-sync",
        "wal_sync",
        "str",
        "always (default), interval=<ms> (bounded loss window) or never (tests only)",
    ),
    ("--pre-vote", "pre_vote", "bool", "use raft PreVote"),
    (
        "--auto-compaction-mode",
        "auto_compaction_mode",
        "str",
        "periodic (retention is a duration) or revision (retention is a revision count)",
    ),
    (
        "--auto-compaction-retention",
        "auto_compaction_retention",
        "str",
        "history kept by auto-compaction: 1h, 30m, a bare number of hours, or revisions; "
        "0 disables it",
    ),
    (
        "--auto-compaction-check-interval",
        "auto_compaction_check_interval",
        "str",
        "how often revision-mode auto-compaction checks (raftkv only; etcd fixes 5m)",
    ),
    (
        "--quota-backend-bytes",
        "quota_backend_bytes",
        "int",
        "space quota: over it, puts, txns with puts and lease grants fail and a NOSPACE alarm "
        "is raised; counts the store's db size (the encoded size of the live data plus its "
        "uncompacted history, as status reports it), not process memory; 0 = 2 GiB",
    ),
    (
        "--archive-url",
        "archive_url",
        "str",
        "archive snapshots and WAL segments continuously to this fsspec URL (file://, s3://...)",
    ),
    (
        "--archive-retention",
        "archive_retention",
        "int",
        "archived snapshots kept, with the WAL they need (0 = keep everything)",
    ),
    (
        "--archive-interval",
        "archive_interval_ms",
        "int",
        "milliseconds between archive passes (bounds what the archive may lack)",
    ),
    (
        "--archive-options",
        "archive_options",
        "str",
        "fsspec/s3fs storage options for --archive-url: key=value[,key=value...]",
    ),
    (
        "--ui-write",
        "ui_write",
        "bool",
        "let the dashboard (/ui/) put and delete keys and move the leader (default: read-only)",
    ),
    (
        "--slow-disk-transfer",
        "slow_disk_transfer",
        "bool",
        "a leader whose WAL fsyncs are slow hands leadership to a follower with a healthy disk",
    ),
    (
        "--slow-disk-fsync-threshold",
        "slow_disk_fsync_threshold_ms",
        "int",
        "milliseconds: a WAL fsync p99 at or past this is a slow disk (a healthy one: below half)",
    ),
    (
        "--slow-disk-window",
        "slow_disk_window_ms",
        "int",
        "milliseconds of WAL fsyncs the slow-disk p99 is taken over",
    ),
    (
        "--slow-disk-transfer-interval",
        "slow_disk_transfer_interval_ms",
        "int",
        "milliseconds: at most one slow-disk leadership transfer from a member per interval",
    ),
    (
        "--disk-stall-timeout",
        "disk_stall_timeout_ms",
        "int",
        "milliseconds a WAL fsync may wait before /health reports the disk stalled (0: never)",
    ),
    ("--cert-file", "cert_file", "str", "client TLS: certificate file (PEM)"),
    ("--key-file", "key_file", "str", "client TLS: private key file (PEM; keep it secret)"),
    (
        "--trusted-ca-file",
        "trusted_ca_file",
        "str",
        "client TLS: CA bundle that signs client certificates",
    ),
    (
        "--client-cert-auth",
        "client_cert_auth",
        "bool",
        "refuse clients without a certificate signed by --trusted-ca-file",
    ),
    (
        "--auto-tls",
        "auto_tls",
        "bool",
        "client TLS with a generated self-signed certificate (encrypts, does not authenticate)",
    ),
    ("--peer-cert-file", "peer_cert_file", "str", "peer TLS: certificate file (PEM)"),
    ("--peer-key-file", "peer_key_file", "str", "peer TLS: private key file (PEM; keep it secret)"),
    (
        "--peer-trusted-ca-file",
        "peer_trusted_ca_file",
        "str",
        "peer TLS: CA bundle that signs the members' certificates",
    ),
    (
        "--peer-client-cert-auth",
        "peer_client_cert_auth",
        "bool",
        "refuse peers without a certificate signed by --peer-trusted-ca-file",
    ),
    (
        "--peer-auto-tls",
        "peer_auto_tls",
        "bool",
        "peer TLS with a generated self-signed certificate (encrypts, does not authenticate)",
    ),
)


def add_server_flags(parser: argparse.ArgumentParser) -> None:
    defaults = ServerConfig()
    for flag, attr, kind, text in _FLAGS:
        default = getattr(defaults, attr)
        shown = ",".join(default) if kind == "urls" else default
        env = "RAFTKV_" + flag[2:].upper().replace("-", "_")
        # A bool flag alone means true (etcd: --client-cert-auth); "--pre-vote false" works.
        extra: dict[str, Any] = {"nargs": "?", "const": "true"} if kind == "bool" else {}
        parser.add_argument(
            flag, dest=attr, default=None, **extra, help=f"{text} (default {shown!r}; env {env})"
        )


def client_frontends_auto() -> int:
    """``--client-frontends auto``: one front end per core beyond the first, at least one."""
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    return max(1, min(MAX_GRPC_FRONTENDS, (cores or 1) - 1))


def _convert(kind: str, flag: str, raw: str):
    if kind == "frontends":
        if raw.strip().lower() == "auto":
            return client_frontends_auto()
        kind = "int"
    if kind == "int":
        try:
            value = int(raw)
        except ValueError:
            raise ClusterConfigError(f"{flag}: want an integer, got {raw!r}") from None
        if value < 0:
            raise ClusterConfigError(f"{flag}: must not be negative")
        return value
    if kind == "bool":
        if raw.lower() in ("1", "true", "yes", "on"):
            return True
        if raw.lower() in ("0", "false", "no", "off"):
            return False
        raise ClusterConfigError(f"{flag}: want true or false, got {raw!r}")
    if kind == "urls":
        urls = tuple(check_url(u.strip()) for u in raw.split(",") if u.strip())
        if not urls:
            raise ClusterConfigError(f"{flag}: no URL given")
        return urls
    return raw


def config_from_args(args: argparse.Namespace, environ=os.environ) -> ServerConfig:
    """Build and validate a ServerConfig; raises ClusterConfigError with a clear message."""
    values = {}
    for flag, attr, kind, _ in _FLAGS:
        raw = getattr(args, attr, None)
        if raw is None:
            raw = environ.get("RAFTKV_" + flag[2:].upper().replace("-", "_"))
        if raw is not None:
            values[attr] = _convert(kind, flag, raw)
    # a member started from the command line serves clients from front-end processes
    values.setdefault("grpc_frontends", client_frontends_auto())
    cfg = ServerConfig(**values)
    if cfg.initial_cluster_state not in ("new", "existing"):
        raise ClusterConfigError("--initial-cluster-state must be 'new' or 'existing'")
    if cfg.heartbeat_interval_ms <= 0 or cfg.election_timeout_ms < 2 * cfg.heartbeat_interval_ms:
        raise ClusterConfigError(
            "--election-timeout must be at least twice --heartbeat-interval (and both > 0)"
        )
    if (
        cfg.wal_sync != "always"
        and cfg.wal_sync != "never"
        and not cfg.wal_sync.startswith("interval=")
    ):
        raise ClusterConfigError("--wal-sync: want always, interval=<ms> or never")
    if (
        cfg.slow_disk_fsync_threshold_ms <= 0
        or cfg.slow_disk_window_ms <= 0
        or cfg.slow_disk_transfer_interval_ms < 0
        or cfg.disk_stall_timeout_ms < 0
    ):
        raise ClusterConfigError(
            "--slow-disk-fsync-threshold and --slow-disk-window must be > 0, "
            "--slow-disk-transfer-interval and --disk-stall-timeout >= 0"
        )
    if cfg.grpc_frontends > MAX_GRPC_FRONTENDS:
        raise ClusterConfigError(f"--client-frontends: at most {MAX_GRPC_FRONTENDS}")
    try:
        _ = cfg.auto_compaction  # parse now: a bad flag stops the start with a message
    except ValueError as exc:
        raise ClusterConfigError(str(exc)) from None
    initial = cfg.initial_cluster or f"{cfg.name}={','.join(cfg.initial_advertise_peer_urls)}"
    members = parse_initial_cluster(initial, cfg.initial_cluster_token)
    cfg = ServerConfig(**{**values, "initial_cluster": initial, "members": tuple(members)})
    local = cfg.local_member()
    if set(local.peer_urls) != set(cfg.initial_advertise_peer_urls):
        raise ClusterConfigError(
            f"--initial-advertise-peer-urls {','.join(cfg.initial_advertise_peer_urls)} do "
            f"not match {cfg.name}'s entry in --initial-cluster ({','.join(local.peer_urls)})"
        )
    check_url_schemes(cfg)
    return cfg


# Which TLS material each kind of URL needs, named as etcd's flags (for the messages).
_TLS_FLAGS = {
    "client": "--cert-file and --key-file (or --auto-tls)",
    "peer": "--peer-cert-file and --peer-key-file (or --peer-auto-tls)",
}


def tls_configured(cfg: ServerConfig, kind: str) -> bool:
    """Whether this member can serve TLS for ``kind`` ("client" or "peer") URLs: a
    certificate and key pair, or auto-TLS, and nothing else."""
    if kind == "client":
        return bool(cfg.cert_file and cfg.key_file) or cfg.auto_tls
    return bool(cfg.peer_cert_file and cfg.peer_key_file) or cfg.peer_auto_tls


def check_url_schemes(cfg: ServerConfig) -> None:
    """Refuse ``https://`` client or peer URLs (listen, advertise, --initial-cluster) that
    this member cannot serve with TLS, as etcd does when the cert flags are missing ("TLS
    key/cert (--cert-file, --key-file) must be provided for client url ... with HTTPS
    scheme"): a member must never answer plain HTTP on a URL that says https (clients would
    send credentials in clear text believing they are protected). Also refuses half a pair
    (a certificate without its key), client-cert-auth without a trusted CA, and TLS files
    that cannot be read. ClusterConfigError names the flag, the URL and what is missing."""
    for prefix in ("", "peer-"):
        attr = prefix.replace("-", "_")
        cert, key = getattr(cfg, attr + "cert_file"), getattr(cfg, attr + "key_file")
        if bool(cert) != bool(key):
            raise ClusterConfigError(
                f"--{prefix}cert-file and --{prefix}key-file go together "
                f"(got only --{prefix}{'cert' if cert else 'key'}-file)"
            )
        if getattr(cfg, attr + "client_cert_auth") and not getattr(cfg, attr + "trusted_ca_file"):
            raise ClusterConfigError(
                f"--{prefix}client-cert-auth needs "
                f"--{prefix}trusted-ca-file (the CA that signs the "
                f"certificates to accept)"
            )
        for name in ("cert-file", "key-file", "trusted-ca-file"):
            path = getattr(cfg, attr + name.replace("-", "_"))
            if path and not os.access(path, os.R_OK):
                raise ClusterConfigError(f"--{prefix}{name} {path}: cannot read the file")
    groups = (
        ("client", "--listen-client-urls", cfg.listen_client_urls),
        ("client", "--advertise-client-urls", cfg.advertise_client_urls),
        ("peer", "--listen-peer-urls", cfg.listen_peer_urls),
        ("peer", "--initial-advertise-peer-urls", cfg.initial_advertise_peer_urls),
        ("peer", "--initial-cluster", tuple(u for m in cfg.members for u in m.peer_urls)),
    )
    for kind, flag, urls in groups:
        for url in urls:
            if urlsplit(url).scheme == "https" and not tls_configured(cfg, kind):
                raise ClusterConfigError(
                    f"{flag} {url}: TLS key/cert ({_TLS_FLAGS[kind]}) must be provided for "
                    f"{kind} url {url} with HTTPS scheme; refusing to serve plain HTTP on an "
                    f"https URL"
                )


def host_port(url: str) -> tuple[str | None, int | None]:
    """Host and port of a listen URL (None where the URL has none: all interfaces, or the
    scheme's default port, as aiohttp's TCPSite takes them)."""
    parts = urlsplit(url)
    return parts.hostname, parts.port
