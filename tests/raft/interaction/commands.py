"""The commands a trace file may use, each printing into the environment's output.

    add-nodes N [voters=(1,2,3)] [learners=(4)] [index=I] [prevote=true] [checkquorum=true]
              [max-inflight=N] [max-inflight-bytes=N] [max-size-per-msg=N]
              [max-uncommitted-size=N] [max-committed-size-per-ready=N]
              [read-only=safe|lease] [disable-forwarding=true]
              [election-tick=3] [heartbeat-tick=1] [jitter-seed=S]
        Add N nodes with the next free ids. With voters/learners, each starts from a snapshot
        at index I (default 1, term 1) holding that configuration and a HardState at term 1
        (so the first election is at term 2); without, from an empty storage (a node that
        joins later and is sent a snapshot). Defaults: election-tick 3, heartbeat-tick 1, no
        election-timeout jitter (see env.NoJitterRandom).
    campaign ID                    RawNode.campaign()
    propose ID DATA                RawNode.propose(DATA)
    propose-conf-change ID CC...   one single-node ConfChange per token: vN add voter N,
                                   lN add learner N, rN remove N, uN update N
    process-ready ID...            handle one Ready of each node (persist, send, apply, advance)
    deliver-msgs [drop=(ID,...)] [type=MsgApp] ID...
                                   deliver (print and step) the queued messages to each ID, or
                                   drop those to the drop= ids; "no messages" if none
    stabilize [ID...]              process-ready + deliver-msgs on ID... (default: every node)
                                   until quiescent
    tick-heartbeat ID              tick heartbeat-tick times
    tick-election ID               tick election-tick times
    tick ID [N]                    tick N times (default 1)
    raft-log ID                    the entries in ID's storage
    raft-state                     role, term and leader of every node
    status ID                      RawNode.status() (progress on a leader)
    compact ID INDEX               snapshot ID's state machine at INDEX and compact its log
    read-index ID CTX              RawNode.read_index(CTX)
    transfer-leadership from=ID to=ID
                                   RawNode.transfer_leader(to) on node from
    report-unreachable ID PEER     RawNode.report_unreachable(PEER) on ID
    report-snapshot ID PEER [failed=true]
                                   RawNode.report_snapshot(PEER, failed) on ID
    restart ID                     crash ID and restart it from its storage (env.restart)
    log-level none|info            print nothing / everything (Readies, messages, INFO lines)

Errors of the core (a dropped proposal, a refused step) print as ``error: Type: message``:
they are behaviour the trace pins down. A mistake in the trace itself (unknown command, bad
argument, unknown node) raises TraceUsageError, and a broken invariant inside the core
(RaftInvariantError) is not caught either: both fail the trace, even when rewriting.
"""

from __future__ import annotations

from collections.abc import Callable

from raft import (
    ConfChange,
    ConfChangeType,
    ConfState,
    MessageType,
    RaftError,
    ReadOnlyOption,
)
from tests.raft.interaction.datadriven import Arg, Command
from tests.raft.interaction.env import EnvError, InteractionEnv

MAX_TICKS_PER_COMMAND = 10_000


class TraceUsageError(Exception):
    """The trace uses a command wrongly (file:line in the message)."""


_CC_LETTERS = {
    "v": ConfChangeType.ADD_NODE,
    "l": ConfChangeType.ADD_LEARNER_NODE,
    "r": ConfChangeType.REMOVE_NODE,
    "u": ConfChangeType.UPDATE_NODE,
}


# --- argument helpers ---------------------------------------------------------------------


def _int(text: str, what: str) -> int:
    try:
        return int(text)
    except ValueError:
        raise EnvError(f"{what}: expected an integer, got {text!r}") from None


def _bool(text: str, what: str) -> bool:
    if text in ("true", "false"):
        return text == "true"
    raise EnvError(f"{what}: expected true or false, got {text!r}")


def _positional(cmd: Command) -> list[str]:
    return [a.key for a in cmd.args if not a.vals]


def _keyed(cmd: Command) -> dict[str, Arg]:
    return {a.key: a for a in cmd.args if a.vals}


def _ids(cmd: Command) -> list[int]:
    return [_int(p, f"{cmd.name}: node id") for p in _positional(cmd)]


def _one_id(cmd: Command) -> int:
    ids = _ids(cmd)
    if len(ids) != 1:
        raise EnvError(f"{cmd.name}: expected one node id")
    return ids[0]


def _check_keys(cmd: Command, allowed: set[str]) -> dict[str, Arg]:
    keyed = _keyed(cmd)
    unknown = set(keyed) - allowed
    if unknown:
        raise EnvError(f"{cmd.name}: unknown arguments {sorted(unknown)}")
    return keyed


def _single(arg: Arg) -> str:
    if len(arg.vals) != 1:
        raise EnvError(f"{arg.key}: expected one value")
    return arg.vals[0]


# --- the commands -------------------------------------------------------------------------

_INT_OPTIONS = {
    "max-inflight": "max_inflight_msgs",
    "max-inflight-bytes": "max_inflight_bytes",
    "max-size-per-msg": "max_size_per_msg_bytes",
    "max-uncommitted-size": "max_uncommitted_entries_size_bytes",
    "max-committed-size-per-ready": "max_committed_size_per_ready_bytes",
    "election-tick": "election_tick",
    "heartbeat-tick": "heartbeat_tick",
    "jitter-seed": "jitter_seed",
}
_BOOL_OPTIONS = {
    "prevote": "pre_vote",
    "checkquorum": "check_quorum",
    "disable-forwarding": "disable_proposal_forwarding",
}


def add_nodes(env: InteractionEnv, cmd: Command) -> None:
    pos = _positional(cmd)
    if len(pos) != 1:
        raise EnvError("add-nodes: expected the number of nodes")
    count = _int(pos[0], "add-nodes")
    keyed = _check_keys(
        cmd, {"voters", "learners", "index", "read-only"} | set(_INT_OPTIONS) | set(_BOOL_OPTIONS)
    )
    voters = (
        tuple(sorted(_int(v, "voters") for v in keyed["voters"].vals)) if "voters" in keyed else ()
    )
    learners = (
        tuple(sorted(_int(v, "learners") for v in keyed["learners"].vals))
        if "learners" in keyed
        else ()
    )
    index = _int(_single(keyed["index"]), "index") if "index" in keyed else 1
    kw: dict = {"election_tick": 3, "heartbeat_tick": 1}
    for key, name in _INT_OPTIONS.items():
        if key in keyed:
            kw[name] = _int(_single(keyed[key]), key)
    for key, name in _BOOL_OPTIONS.items():
        if key in keyed:
            kw[name] = _bool(_single(keyed[key]), key)
    if "read-only" in keyed:
        mode = _single(keyed["read-only"])
        if mode not in ("safe", "lease"):
            raise EnvError("read-only: expected safe or lease")
        kw["read_only_option"] = (
            ReadOnlyOption.SAFE if mode == "safe" else ReadOnlyOption.LEASE_BASED
        )
    cs = ConfState(voters=voters, learners=learners)
    for _ in range(count):
        env.add_node(cs, index, kw)


def campaign(env: InteractionEnv, cmd: Command) -> None:
    env.node(_one_id(cmd)).rawnode.campaign()


def propose(env: InteractionEnv, cmd: Command) -> None:
    if len(cmd.tokens) != 2:
        raise EnvError("propose: expected ID DATA (quote DATA if it has spaces)")
    node = env.node(_int(cmd.tokens[0], "propose: node id"))
    node.rawnode.propose(cmd.tokens[1].encode())


def propose_conf_change(env: InteractionEnv, cmd: Command) -> None:
    if len(cmd.tokens) < 2:
        raise EnvError("propose-conf-change: expected ID and at least one change (v2 l3 r4 u5)")
    node = env.node(_int(cmd.tokens[0], "propose-conf-change: node id"))
    changes = []
    for tok in cmd.tokens[1:]:
        kind = _CC_LETTERS.get(tok[:1])
        if kind is None:
            raise EnvError(f"propose-conf-change: bad change {tok!r} (want v2, l3, r4, u5)")
        changes.append(ConfChange(kind, _int(tok[1:], "propose-conf-change")))
    # This core makes single-node (v1) changes only: several tokens are several proposals.
    for cc in changes:
        node.rawnode.propose_conf_change(cc)


def process_ready(env: InteractionEnv, cmd: Command) -> None:
    ids = _ids(cmd)
    if not ids:
        raise EnvError("process-ready: expected node ids")
    for i in ids:
        env.node(i)
    if len(ids) == 1:
        env.process_ready(ids[0])
        return
    for i in ids:
        env.write(f"> {i} handling Ready")
        with env.indented():
            env.process_ready(i)


def deliver_msgs(env: InteractionEnv, cmd: Command) -> None:
    keyed = _check_keys(cmd, {"drop", "type"})
    ids = _ids(cmd)
    drops = [_int(v, "drop") for v in keyed["drop"].vals] if "drop" in keyed else []
    if set(ids) & set(drops):
        raise EnvError("deliver-msgs: cannot both deliver and drop messages to one node")
    mtype = None
    if "type" in keyed:
        name = _single(keyed["type"])
        try:
            mtype = MessageType[name]
        except KeyError:
            raise EnvError(f"deliver-msgs: unknown message type {name}") from None
    if not ids and not drops:
        raise EnvError("deliver-msgs: expected node ids or drop=(...)")
    n = 0
    for i in ids:
        n += env.deliver(i, drop=False, mtype=mtype)
    for i in drops:
        n += env.deliver(i, drop=True, mtype=mtype)
    if n == 0:
        env.write("no messages")


def stabilize(env: InteractionEnv, cmd: Command) -> None:
    ids = _ids(cmd) or sorted(env.nodes)
    env.stabilize(ids)


def _tick(env: InteractionEnv, node_id: int, times: int) -> None:
    if not 0 <= times <= MAX_TICKS_PER_COMMAND:
        raise EnvError(f"tick: between 0 and {MAX_TICKS_PER_COMMAND} ticks")
    node = env.node(node_id)
    for _ in range(times):
        node.rawnode.tick()


def tick_heartbeat(env: InteractionEnv, cmd: Command) -> None:
    node_id = _one_id(cmd)
    _tick(env, node_id, env.node(node_id).config.heartbeat_tick)


def tick_election(env: InteractionEnv, cmd: Command) -> None:
    node_id = _one_id(cmd)
    _tick(env, node_id, env.node(node_id).config.election_tick)


def tick(env: InteractionEnv, cmd: Command) -> None:
    ids = _ids(cmd)
    if len(ids) not in (1, 2):
        raise EnvError("tick: expected ID [N]")
    _tick(env, ids[0], ids[1] if len(ids) == 2 else 1)


def raft_log(env: InteractionEnv, cmd: Command) -> None:
    s = env.node(_one_id(cmd)).storage
    first, last = s.first_index(), s.last_index()
    if last < first:
        env.write(f"log is empty: first index={first}, last index={last}")
        return
    for e in s.entries(first, last + 1):
        env.write(str(e))


def _membership(cs: ConfState, node_id: int) -> str:
    if node_id in cs.voters:
        return "Voter"
    if node_id in cs.learners:
        return "Learner"
    return "Non-Member"


def raft_state(env: InteractionEnv, cmd: Command) -> None:
    for i in sorted(env.nodes):
        st = env.nodes[i].rawnode.status()
        env.write(
            f"{i}: {st.soft_state.raft_state} ({_membership(st.conf_state, i)})"
            f" Term:{st.hard_state.term} Lead:{st.soft_state.lead}"
            f" Commit:{st.hard_state.commit} Applied:{st.applied}"
        )


def status(env: InteractionEnv, cmd: Command) -> None:
    env.write(str(env.node(_one_id(cmd)).rawnode.status()))


def compact(env: InteractionEnv, cmd: Command) -> None:
    ids = _ids(cmd)
    if len(ids) != 2:
        raise EnvError("compact: expected ID INDEX")
    env.compact(ids[0], ids[1])
    raft_log(env, Command("raft-log", (Arg(str(ids[0])),), (str(ids[0]),), "", cmd.pos))


def read_index(env: InteractionEnv, cmd: Command) -> None:
    if len(cmd.tokens) != 2:
        raise EnvError("read-index: expected ID CTX")
    node = env.node(_int(cmd.tokens[0], "read-index: node id"))
    node.rawnode.read_index(cmd.tokens[1].encode())


def transfer_leadership(env: InteractionEnv, cmd: Command) -> None:
    keyed = _check_keys(cmd, {"from", "to"})
    if set(keyed) != {"from", "to"} or _positional(cmd):
        raise EnvError("transfer-leadership: expected from=ID to=ID")
    frm = _int(_single(keyed["from"]), "from")
    to = _int(_single(keyed["to"]), "to")
    env.node(frm).rawnode.transfer_leader(to)


def report_unreachable(env: InteractionEnv, cmd: Command) -> None:
    ids = _ids(cmd)
    if len(ids) != 2:
        raise EnvError("report-unreachable: expected ID PEER")
    env.node(ids[0]).rawnode.report_unreachable(ids[1])


def report_snapshot(env: InteractionEnv, cmd: Command) -> None:
    keyed = _check_keys(cmd, {"failed"})
    ids = _ids(cmd)
    if len(ids) != 2:
        raise EnvError("report-snapshot: expected ID PEER [failed=true]")
    failed = _bool(_single(keyed["failed"]), "failed") if "failed" in keyed else False
    env.node(ids[0]).rawnode.report_snapshot(ids[1], failed)


def restart(env: InteractionEnv, cmd: Command) -> None:
    env.restart(_one_id(cmd))


def log_level(env: InteractionEnv, cmd: Command) -> None:
    pos = _positional(cmd)
    if pos not in (["none"], ["info"]):
        raise EnvError("log-level: expected none or info")
    env.silent = pos[0] == "none"


COMMANDS: dict[str, Callable[[InteractionEnv, Command], None]] = {
    "add-nodes": add_nodes,
    "campaign": campaign,
    "propose": propose,
    "propose-conf-change": propose_conf_change,
    "process-ready": process_ready,
    "deliver-msgs": deliver_msgs,
    "stabilize": stabilize,
    "tick-heartbeat": tick_heartbeat,
    "tick-election": tick_election,
    "tick": tick,
    "raft-log": raft_log,
    "raft-state": raft_state,
    "status": status,
    "compact": compact,
    "read-index": read_index,
    "transfer-leadership": transfer_leadership,
    "report-unreachable": report_unreachable,
    "report-snapshot": report_snapshot,
    "restart": restart,
    "log-level": log_level,
}


def execute(env: InteractionEnv, cmd: Command) -> str:
    """Run ``cmd`` against ``env`` and return everything it printed."""
    handler = COMMANDS.get(cmd.name)
    if handler is None:
        raise TraceUsageError(f"{cmd.pos}: unknown command {cmd.name!r}")
    try:
        handler(env, cmd)
    except EnvError as e:
        raise TraceUsageError(f"{cmd.pos}: {cmd.text!r}: {e}") from None
    except RaftError as e:
        env.write(f"error: {type(e).__name__}: {e}")
    return env.take_output()
