"""Members in their own network namespaces on a bridge, and partitions between them.

Contract
--------
:class:`NetTopology` creates, for one run:

- a bridge ``rkc<pid><s>b`` in the root namespace holding ``10.77.X.1/24`` (``X`` is a /24 that
  no interface on this machine uses yet), so the test process reaches every member from the
  root namespace;
- per member a namespace ``rkc<pid><s>n<i>`` with ``lo`` up and one end of a veth pair
  (``10.77.X.<10+i>/24``); the other end (``rkc<pid><s>h<i>``) is a port of the bridge;
- one ``iptables -I FORWARD -i BR -o BR -j ACCEPT`` rule in the root namespace, tagged with
  the comment ``rkc<pid><s>`` (``<s>``: a letter per topology of the process): bridged frames pass through the FORWARD chain when
  ``br_netfilter`` is loaded, and Docker sets that chain's policy to DROP.

Nothing else on the machine is touched: no route, no NAT, no address outside the /24.

Partitions are DROP rules *inside* the member namespaces (``INPUT -s peer`` and
``OUTPUT -d peer``), so a cut is between members only: the root namespace (the test's
clients) still reaches every member, as Jepsen's control node does. :meth:`partition` takes
the set of member pairs that must not talk (symmetric) and replaces whatever cut was there;
:meth:`heal` removes every cut. Dropping (not rejecting) packets is what a lost link looks
like: open connections hang until their own timeouts.

Cleanup: :meth:`close` deletes the rule, the namespaces and the bridge (the veths go with the
namespaces); it is idempotent, registered with ``atexit`` at creation, and meant to be called
in ``finally``. :func:`collect_garbage` removes what an aborted run (a dead pid) left behind,
so an aborted run never breaks the next one. The caller must stop the processes it started
inside the namespaces first (a namespace's processes outlive ``ip netns del``).

:func:`unavailable_reason` says why namespaces cannot be used here (not root, no ``ip``, no
``iptables``, ``ip netns add`` fails), or ``None``.
"""

from __future__ import annotations

import atexit
import ipaddress
import os
import re
import shutil
import subprocess
import uuid

PREFIX = "rkc"
_NAME_RE = re.compile(rf"^{PREFIX}(\d+)[a-z][bnhv]\d*$")
_COMMENT_RE = re.compile(rf"--comment\s+\"?{PREFIX}(\d+)[a-z]\"?")
_SERIALS = iter("abcdefghijklmnopqrstuvwxyz")  # one letter per topology of this process


class NetError(RuntimeError):
    """A command that sets up or changes the topology failed (the message has its output)."""


def _run(*args: str, check: bool = True, timeout_s: float = 20.0) -> subprocess.CompletedProcess:
    proc = subprocess.run(list(args), capture_output=True, text=True, timeout=timeout_s)
    if check and proc.returncode != 0:
        raise NetError(
            f"{' '.join(args)} -> exit {proc.returncode}: {(proc.stderr or proc.stdout).strip()}"
        )
    return proc


def unavailable_reason() -> str | None:
    if os.name != "posix" or os.geteuid() != 0:
        return "network namespaces need root (ip netns, veth, iptables)"
    for tool in ("ip", "iptables"):
        if shutil.which(tool) is None:
            return f"{tool!r} is not installed (Debian: iproute2, iptables)"
    probe = f"{PREFIX}{os.getpid()}probe{uuid.uuid4().hex[:4]}"
    try:
        made = _run("ip", "netns", "add", probe, check=False)
        if made.returncode != 0:
            return f"`ip netns add` fails here: {made.stderr.strip()}"
        rules = _run("ip", "netns", "exec", probe, "iptables", "-S", check=False)
        if rules.returncode != 0:
            return f"iptables does not work inside a namespace: {rules.stderr.strip()}"
    finally:
        _run("ip", "netns", "del", probe, check=False)
    return None


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def collect_garbage() -> list[str]:
    """Delete namespaces, bridges and FORWARD rules of earlier runs whose process is gone.
    Returns what was removed."""
    removed: list[str] = []
    for line in _run("iptables", "-S", "FORWARD", check=False).stdout.splitlines():
        m = _COMMENT_RE.search(line)
        if m and not _pid_alive(int(m.group(1))) and line.startswith("-A "):
            _run("iptables", "-D", *_split_rule(line[3:]), check=False)
            removed.append(f"rule {line}")
    for line in _run("ip", "netns", "list", check=False).stdout.splitlines():
        name = line.split()[0] if line.split() else ""
        m = re.match(rf"^{PREFIX}(\d+)", name)
        if m and not _pid_alive(int(m.group(1))):
            _run("ip", "netns", "del", name, check=False)
            removed.append(f"netns {name}")
    for line in _run("ip", "-o", "link", "show", check=False).stdout.splitlines():
        parts = line.split(":")
        if len(parts) < 2:
            continue
        name = parts[1].strip().split("@")[0]
        m = _NAME_RE.match(name)
        if m and not _pid_alive(int(m.group(1))):
            _run("ip", "link", "del", name, check=False)
            removed.append(f"link {name}")
    return removed


def _split_rule(spec: str) -> list[str]:
    import shlex

    return shlex.split(spec)


def _used_networks() -> list[ipaddress.IPv4Network]:
    nets = []
    for line in _run("ip", "-o", "-4", "addr", "show", check=False).stdout.splitlines():
        m = re.search(r"inet (\S+)", line)
        if m:
            nets.append(ipaddress.ip_interface(m.group(1)).network)
    return nets


class NetTopology:
    def __init__(self, size: int, *, second_octet: int = 77):
        self.size = size
        try:
            serial = next(_SERIALS)
        except StopIteration:
            raise NetError("more than 26 topologies in one process") from None
        self.tag = f"{PREFIX}{os.getpid()}{serial}"  # <= 15 chars with the suffixes below
        self.bridge = f"{self.tag}b"
        self.namespaces = [f"{self.tag}n{i + 1}" for i in range(size)]
        self._host_veths = [f"{self.tag}h{i + 1}" for i in range(size)]
        self._created: list[tuple[str, str]] = []  # ("netns"|"link"|"rule", name)
        self._cuts: set[frozenset[int]] = set()
        self._closed = False
        used = _used_networks()
        start = os.getpid() % 200 + 20
        for k in range(250):
            third = (start + k) % 250 + 1
            net = ipaddress.ip_network(f"10.{second_octet}.{third}.0/24")
            if not any(net.overlaps(u) for u in used):
                break
        else:
            raise NetError(f"no free /24 under 10.{second_octet}.0.0/16")
        self.network = net
        hosts = list(net.hosts())
        self.gateway = str(hosts[0])  # .1, on the bridge
        self.addresses = [str(hosts[9 + i]) for i in range(size)]  # .10, .11, ...
        atexit.register(self.close)

    # -- setup ------------------------------------------------------------------------------

    def create(self) -> NetTopology:
        prefix = self.network.prefixlen
        try:
            _run("ip", "link", "add", self.bridge, "type", "bridge")
            self._created.append(("link", self.bridge))
            _run("ip", "addr", "add", f"{self.gateway}/{prefix}", "dev", self.bridge)
            _run("ip", "link", "set", self.bridge, "up")
            _run(
                "iptables",
                "-I",
                "FORWARD",
                "1",
                "-i",
                self.bridge,
                "-o",
                self.bridge,
                "-m",
                "comment",
                "--comment",
                self.tag,
                "-j",
                "ACCEPT",
            )
            self._created.append(("rule", self.bridge))
            for i, ns in enumerate(self.namespaces):
                _run("ip", "netns", "add", ns)
                self._created.append(("netns", ns))
                inner = f"{self.tag}v{i + 1}"
                _run(
                    "ip", "link", "add", self._host_veths[i], "type", "veth", "peer", "name", inner
                )
                self._created.append(("link", self._host_veths[i]))
                _run("ip", "link", "set", inner, "netns", ns)
                _run("ip", "link", "set", self._host_veths[i], "master", self.bridge)
                _run("ip", "link", "set", self._host_veths[i], "up")
                self.exec(i, "ip", "link", "set", "lo", "up")
                self.exec(i, "ip", "link", "set", inner, "name", "eth0")
                self.exec(i, "ip", "addr", "add", f"{self.addresses[i]}/{prefix}", "dev", "eth0")
                self.exec(i, "ip", "link", "set", "eth0", "up")
        except BaseException:
            self.close()
            raise
        return self

    def exec(self, member: int, *args: str, check: bool = True) -> subprocess.CompletedProcess:
        return _run("ip", "netns", "exec", self.namespaces[member], *args, check=check)

    def command_prefix(self, member: int) -> list[str]:
        """Prepend to a command to run it inside member ``member``'s namespace (``ip netns
        exec`` execs the command: the child's pid is the command's pid)."""
        return ["ip", "netns", "exec", self.namespaces[member]]

    # -- partitions -------------------------------------------------------------------------

    def partition(self, cuts: set[frozenset[int]]) -> None:
        """Make exactly the member pairs in ``cuts`` unable to talk (both directions)."""
        self.heal()
        for pair in cuts:
            a, b = sorted(pair)
            for me, other in ((a, b), (b, a)):
                peer = self.addresses[other]
                self.exec(me, "iptables", "-A", "INPUT", "-s", peer, "-j", "DROP")
                self.exec(me, "iptables", "-A", "OUTPUT", "-d", peer, "-j", "DROP")
        self._cuts = set(cuts)

    def isolate(self, member: int) -> None:
        self.partition({frozenset((member, o)) for o in range(self.size) if o != member})

    def heal(self) -> None:
        for i in range(self.size):
            self.exec(i, "iptables", "-F", "INPUT")
            self.exec(i, "iptables", "-F", "OUTPUT")
        self._cuts = set()

    @property
    def cuts(self) -> set[frozenset[int]]:
        return set(self._cuts)

    # -- cleanup ----------------------------------------------------------------------------

    def close(self) -> list[str]:
        """Remove everything this topology created (idempotent); returns what failed."""
        if self._closed:
            return []
        self._closed = True
        errors = []
        for kind, name in reversed(self._created):
            if kind == "rule":
                cmd = (
                    "iptables",
                    "-D",
                    "FORWARD",
                    "-i",
                    name,
                    "-o",
                    name,
                    "-m",
                    "comment",
                    "--comment",
                    self.tag,
                    "-j",
                    "ACCEPT",
                )
            elif kind == "netns":
                cmd = ("ip", "netns", "del", name)
            else:
                cmd = ("ip", "link", "del", name)
            proc = _run(*cmd, check=False)
            # a veth disappears with its namespace: "Cannot find device" is not a failure
            if proc.returncode != 0 and "Cannot find device" not in proc.stderr:
                errors.append(f"{' '.join(cmd)}: {proc.stderr.strip()}")
        self._created.clear()
        try:
            atexit.unregister(self.close)
        except Exception:  # noqa: BLE001 - interpreter shutting down
            pass
        return errors

    def leftovers(self) -> list[str]:
        """Namespaces, links and FORWARD rules of this run still present (empty after close)."""
        left = []
        netns = _run("ip", "netns", "list", check=False).stdout
        left += [ns for ns in self.namespaces if re.search(rf"^{ns}\b", netns, re.M)]
        links = _run("ip", "-o", "link", "show", check=False).stdout
        left += [n for n in [self.bridge, *self._host_veths] if f": {n}" in links]
        rules = _run("iptables", "-S", "FORWARD", check=False).stdout
        left += [line for line in rules.splitlines() if self.tag in line]
        return left
