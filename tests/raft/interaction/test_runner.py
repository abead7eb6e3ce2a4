"""The trace runner itself: parsing, mismatch reports, rewriting, usage errors, determinism.

These keep the trace tests honest: a runner that compared nothing, or rewrote silently,
would let every trace pass.
"""

import random
import shutil
from pathlib import Path

import pytest

from tests.raft.interaction.commands import TraceUsageError, execute
from tests.raft.interaction.datadriven import (
    Arg,
    TraceFormatError,
    TraceMismatchError,
    normalize_output,
    parse_command,
    parse_lines,
    run_file,
)
from tests.raft.interaction.env import InteractionEnv, NoJitterRandom
from tests.raft.interaction.runner import TESTDATA, main, run_trace

SMALL_TRACE = """\
# A comment header.

add-nodes 1 voters=(1) index=5
----
INFO 1 became follower at term 1

campaign 1
----
INFO 1 became candidate at term 2
INFO 1 became leader at term 2

## a sub-comment between blocks
raft-state
----
1: StateLeader (Voter) Term:2 Lead:1 Commit:5 Applied:5
"""


def test_parse_command_arguments() -> None:
    # (no spaces inside the parentheses: tokens are split like a shell)
    cmd = parse_command('deliver-msgs drop=(2,3) type=MsgApp 1 "two words"', "f.txt:1")
    assert cmd.name == "deliver-msgs"
    assert cmd.args == (
        Arg("drop", ("2", "3")),
        Arg("type", ("MsgApp",)),
        Arg("1"),
        Arg("two words"),
    )
    assert cmd.tokens[-1] == "two words"


def test_parse_blocks_and_positions() -> None:
    blocks = parse_lines(SMALL_TRACE.splitlines(), "t.txt")
    assert [b.command.name for b in blocks] == ["add-nodes", "campaign", "raft-state"]
    assert blocks[0].command.pos == "t.txt:3"
    assert blocks[1].expected == (
        "INFO 1 became candidate at term 2",
        "INFO 1 became leader at term 2",
    )


@pytest.mark.parametrize(
    "text",
    ["campaign 1\nok\n", "----\nok\n", "campaign 1\n"],
    ids=["no-separator", "separator-without-command", "command-at-eof"],
)
def test_malformed_files_are_rejected(text: str) -> None:
    with pytest.raises(TraceFormatError):
        parse_lines(text.splitlines(), "bad.txt")


def test_normalize_output() -> None:
    assert normalize_output("") == ("ok",)
    assert normalize_output("a  \n\n  b\n") == ("a", "  b")


def _run(path: Path, rewrite: bool = False) -> int:
    env = InteractionEnv()
    return run_file(path, lambda cmd: execute(env, cmd), rewrite=rewrite)


def test_matching_trace_passes(tmp_path: Path) -> None:
    p = tmp_path / "t.txt"
    p.write_text(SMALL_TRACE)
    assert _run(p) == 3


def test_mismatch_names_file_line_and_shows_a_diff(tmp_path: Path) -> None:
    p = tmp_path / "t.txt"
    p.write_text(SMALL_TRACE.replace("Commit:5 Applied:5", "Commit:6 Applied:5"))
    with pytest.raises(TraceMismatchError) as e:
        _run(p)
    msg = str(e.value)
    assert "t.txt:13" in msg and "'raft-state'" in msg
    assert "-1: StateLeader (Voter) Term:2 Lead:1 Commit:6 Applied:5" in msg
    assert "+1: StateLeader (Voter) Term:2 Lead:1 Commit:5 Applied:5" in msg


def test_rewrite_fixes_outputs_and_keeps_everything_else(tmp_path: Path) -> None:
    p = tmp_path / "t.txt"
    broken = SMALL_TRACE.replace(
        "INFO 1 became candidate at term 2\nINFO 1 became leader at term 2\n", "ok\n"
    ).replace("Commit:5 Applied:5", "stale")
    p.write_text(broken)
    _run(p, rewrite=True)
    assert p.read_text() == SMALL_TRACE
    _run(p)  # and it now passes


def test_rewrite_of_a_correct_file_changes_nothing(tmp_path: Path) -> None:
    p = tmp_path / "t.txt"
    shutil.copy(TESTDATA / "first_election.txt", p)
    before = p.read_bytes()
    _run(p, rewrite=True)
    assert p.read_bytes() == before


def test_a_changed_expectation_in_a_real_trace_fails(tmp_path: Path) -> None:
    p = tmp_path / "t.txt"
    text = (TESTDATA / "log_conflict_repair.txt").read_text()
    assert "Rejected (Hint: 12)" in text
    p.write_text(text.replace("Rejected (Hint: 12)", "Rejected (Hint: 11)", 1))
    with pytest.raises(TraceMismatchError):
        _run(p)


@pytest.mark.parametrize(
    "line",
    [
        "no-such-command 1",
        "campaign 7",
        "add-nodes 3 voters=(1,2,3) bogus=1",
        "deliver-msgs drop=(1) 1",
        "log-level loud",
    ],
)
def test_mistakes_in_a_trace_fail_loudly(tmp_path: Path, line: str) -> None:
    p = tmp_path / "t.txt"
    p.write_text(
        f"log-level none\n----\nok\n\nadd-nodes 1 voters=(1)\n----\nok\n\n{line}\n----\nok\n"
    )
    with pytest.raises(TraceUsageError):
        _run(p)


def test_core_errors_are_printed_as_behaviour() -> None:
    env = InteractionEnv()
    execute(env, parse_command("add-nodes 3 voters=(1,2,3)", "x:1"))
    out = execute(env, parse_command("propose 2 x", "x:2"))
    assert out == "error: ProposalDroppedError: no leader"


def test_no_jitter_random_yields_minimums() -> None:
    r = NoJitterRandom()
    assert isinstance(r, random.Random)
    assert {r.randrange(10) for _ in range(20)} == {0}
    assert r.randint(3, 9) == 3 and r.random() == 0.0


def test_jitter_seed_randomizes_timeouts_deterministically() -> None:
    def timeouts(seed: int) -> list[int]:
        env = InteractionEnv()
        execute(env, parse_command(f"add-nodes 5 voters=(1,2,3,4,5) jitter-seed={seed}", "x:1"))
        return [n.rawnode.raft.randomized_election_timeout for n in env.nodes.values()]

    assert timeouts(7) == timeouts(7)
    assert all(3 <= t < 6 for t in timeouts(7))
    assert len(set(timeouts(7) + timeouts(8))) > 1


def test_every_trace_runs_identically_twice(tmp_path: Path) -> None:
    # Determinism: a second run of every file reproduces the outputs byte for byte.
    for src in sorted(TESTDATA.glob("*.txt")):
        p = tmp_path / src.name
        shutil.copy(src, p)
        run_trace(p, rewrite=True)
        assert p.read_bytes() == src.read_bytes(), src.name


def test_command_line_tool(tmp_path: Path, capsys) -> None:
    p = tmp_path / "t.txt"
    p.write_text(SMALL_TRACE)
    assert main([str(p)]) == 0
    p.write_text(SMALL_TRACE.replace("Term:2 Lead:1", "Term:3 Lead:1"))
    assert main([str(p)]) == 1
    assert "FAIL t.txt" in capsys.readouterr().out
