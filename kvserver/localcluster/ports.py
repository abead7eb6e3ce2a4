"""Is a member's port free, and if not, who holds it.

``raftkv cluster up`` checks every client and peer port before starting anything: a port that
is taken would only make its member fail at start, again and again. ``taken_ports`` tries to
bind each port on its member's host, as the member itself binds (SO_REUSEADDR, so a port held
only by connections in TIME_WAIT counts as free, as it does for the member), and names the
holder where it can: on Linux the listening socket's inode from /proc/net/tcp{,6} and the
process whose open files include that socket. Anything it cannot read (another user's
processes, another network namespace, no /proc) makes the holder "unknown".
"""

import os
import socket
from collections.abc import Iterable
from dataclasses import dataclass
from urllib.parse import urlsplit

from kvserver.localcluster.launcher import NodeProcess

TCP_LISTEN = "0A"  # socket states in /proc/net/tcp (include/net/tcp_states.h)
TCP_TIME_WAIT = "06"
CMDLINE_MAX = 200


@dataclass(frozen=True)
class PortConflict:
    member: str
    role: str  # "client" or "peer"
    host: str
    port: int
    holder: str  # "pid N (command line)" or "unknown"

    def message(self) -> str:
        return (
            f"port {self.port} on {self.host} ({self.member}'s {self.role} port) is already "
            f"in use by {self.holder}"
        )


def port_is_free(host: str, port: int) -> bool:
    """True when a listener could bind ``host:port`` right now."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind((host, port))
        except OSError:
            return False
    return True


def taken_ports(nodes: Iterable[NodeProcess]) -> list[PortConflict]:
    """Every client or peer port of ``nodes`` that cannot be bound, with its holder."""
    conflicts = []
    for node in nodes:
        for role, url in (("client", node.client_url), ("peer", node.peer_url)):
            parts = urlsplit(url)
            host, port = parts.hostname or "127.0.0.1", parts.port
            if port is not None and not port_is_free(host, port):
                conflicts.append(PortConflict(node.name, role, host, port, port_holder(port)))
    return conflicts


def port_holder(port: int) -> str:
    """Best effort: "pid N (command line)" of a process with a TCP socket on local ``port``
    (a listening one preferred), else "unknown"."""
    inodes = _socket_inodes(port)
    if not inodes:
        return "unknown"
    pids = _pids_with_sockets(inodes)
    if not pids:
        return "unknown"
    return ", ".join(f"pid {pid} ({_cmdline(pid)})" for pid in sorted(pids))


def _socket_inodes(port: int) -> set[str]:
    listening: set[str] = set()
    other: set[str] = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            with open(table) as f:
                rows = f.read().splitlines()[1:]
        except OSError:
            continue
        for row in rows:
            fields = row.split()
            if len(fields) < 10:
                continue
            local, state, inode = fields[1], fields[3], fields[9]
            try:
                local_port = int(local.rsplit(":", 1)[1], 16)
            except (IndexError, ValueError):
                continue
            if local_port != port or inode == "0":
                continue
            if state == TCP_LISTEN:
                listening.add(inode)
            elif state != TCP_TIME_WAIT:
                other.add(inode)
    return listening or other


def _pids_with_sockets(inodes: set[str]) -> set[int]:
    wanted = {f"socket:[{inode}]" for inode in inodes}
    pids: set[int] = set()
    try:
        entries = os.listdir("/proc")
    except OSError:
        return pids
    for entry in entries:
        if not entry.isdigit():
            continue
        fd_dir = f"/proc/{entry}/fd"
        try:
            fds = os.listdir(fd_dir)
        except OSError:  # gone, or another user's
            continue
        for fd in fds:
            try:
                if os.readlink(f"{fd_dir}/{fd}") in wanted:
                    pids.add(int(entry))
                    break
            except OSError:
                continue
    return pids


def _cmdline(pid: int) -> str:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            args = f.read().split(b"\0")
    except OSError:
        return "command unknown"
    text = " ".join(" ".join(a.decode(errors="replace").split()) for a in args if a)
    if len(text) > CMDLINE_MAX:
        text = text[: CMDLINE_MAX - 3] + "..."
    return text or "command unknown"
