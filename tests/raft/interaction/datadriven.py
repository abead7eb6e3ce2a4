"""Data-driven trace files: parse them, run their commands, compare or rewrite the output.

The format (the one cockroachdb/datadriven and etcd-io/raft's interaction tests use):

    # Comment lines say what the trace shows. They may appear between any two blocks.
    command arg key=value key=(v1,v2)
    ----
    expected output, verbatim,
    up to the next blank line (or the end of the file)

* A block is one command line, a line holding exactly ``----``, and the expected output.
  Blocks are separated by blank lines; the expected output therefore never contains a blank
  line (the environment never prints one), and an empty output is written as ``ok``.
* Arguments are split like a shell (``shlex``): ``propose 1 "two words"`` works. A token
  ``key=value`` becomes ``Arg(key, (value,))``; ``key=(a,b)`` becomes ``Arg(key, ("a", "b"))``;
  any other token ``t`` becomes ``Arg(t, ())``.
* ``run_file`` executes the blocks in order against one ``execute(command) -> str`` callable
  (one fresh environment per file) and stops at the first mismatch, reporting the file, the
  line, the command and a unified diff. With ``rewrite=True`` it runs every block and writes
  the actual outputs back into the file in place; everything else (comments, commands, blank
  lines) is kept byte for byte.
"""

from __future__ import annotations

import difflib
import shlex
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

SEPARATOR = "----"
EMPTY_OUTPUT = "ok"
MAX_BLOCKS_PER_FILE = 10_000  # a bound on what one file may ask for


class TraceFormatError(Exception):
    """The trace file does not follow the format (file and line in the message)."""


class TraceMismatchError(AssertionError):
    """A command printed something other than what the trace file expects."""


@dataclass(frozen=True, slots=True)
class Arg:
    key: str
    vals: tuple[str, ...] = ()

    def __str__(self) -> str:
        if not self.vals:
            return self.key
        if len(self.vals) == 1:
            return f"{self.key}={self.vals[0]}"
        return f"{self.key}=({','.join(self.vals)})"


@dataclass(frozen=True, slots=True)
class Command:
    name: str
    args: tuple[Arg, ...]
    tokens: tuple[str, ...]  # the shell-split words after the name, unparsed
    text: str  # the command line as written
    pos: str  # "file.txt:LINE", for error messages


@dataclass(frozen=True, slots=True)
class Block:
    command: Command
    expected: tuple[str, ...]
    # 0-based line numbers in the file: the expected output is lines[out_start:out_end]
    out_start: int
    out_end: int


def parse_arg(token: str) -> Arg:
    key, eq, value = token.partition("=")
    if not eq:
        return Arg(token)
    if value.startswith("(") and value.endswith(")"):
        inner = value[1:-1].strip()
        vals = tuple(v.strip() for v in inner.split(",")) if inner else ()
        return Arg(key, vals)
    return Arg(key, (value,))


def parse_command(text: str, pos: str) -> Command:
    try:
        words = shlex.split(text, comments=False, posix=True)
    except ValueError as e:
        raise TraceFormatError(f"{pos}: cannot split {text!r}: {e}") from None
    if not words:
        raise TraceFormatError(f"{pos}: empty command")
    tokens = tuple(words[1:])
    return Command(
        name=words[0],
        args=tuple(parse_arg(t) for t in tokens),
        tokens=tokens,
        text=text,
        pos=pos,
    )


def parse_lines(lines: list[str], name: str) -> list[Block]:
    """Parse the lines of a trace file (without line terminators) into blocks."""
    blocks: list[Block] = []
    i = 0
    n = len(lines)
    while i < n:
        line = lines[i]
        stripped = line.strip()
        if not stripped or stripped.startswith("#"):
            i += 1
            continue
        if stripped == SEPARATOR:
            raise TraceFormatError(f"{name}:{i + 1}: '{SEPARATOR}' without a command above it")
        command = parse_command(stripped, f"{name}:{i + 1}")
        if i + 1 >= n or lines[i + 1].strip() != SEPARATOR:
            raise TraceFormatError(
                f"{name}:{i + 1}: command {stripped!r} must be followed by a '{SEPARATOR}' line"
            )
        start = i + 2
        end = start
        while end < n and lines[end].strip():
            end += 1
        blocks.append(Block(command, tuple(lines[start:end]), start, end))
        if len(blocks) > MAX_BLOCKS_PER_FILE:
            raise TraceFormatError(f"{name}: more than {MAX_BLOCKS_PER_FILE} blocks")
        i = end
    return blocks


def normalize_output(text: str) -> tuple[str, ...]:
    """Lines as they are stored in a file: no trailing spaces, no blank lines, 'ok' if empty."""
    out = tuple(line.rstrip() for line in text.splitlines() if line.strip())
    return out or (EMPTY_OUTPUT,)


def describe_mismatch(block: Block, actual: tuple[str, ...]) -> str:
    diff = difflib.unified_diff(
        list(block.expected), list(actual), "expected", "actual", lineterm="", n=3
    )
    return (
        f"{block.command.pos}: output of {block.command.text!r} differs from the trace file\n"
        + "\n".join(diff)
        + "\n(rerun with --rewrite-traces or RAFT_TRACES_REWRITE=1 to accept the new output,"
        " then review the diff)"
    )


def run_file(
    path: Path,
    execute: Callable[[Command], str],
    rewrite: bool = False,
) -> int:
    """Run every block of the trace at ``path``; return the number of blocks run.

    Without ``rewrite`` the first block whose output differs raises TraceMismatchError.
    With ``rewrite`` the file is rewritten (only if some output changed).
    """
    text = path.read_text(encoding="utf-8")
    lines = text.split("\n")
    if lines and lines[-1] == "":
        lines.pop()  # the final newline
    blocks = parse_lines(lines, path.name)
    replacements: list[tuple[Block, tuple[str, ...]]] = []
    for block in blocks:
        actual = normalize_output(execute(block.command))
        if actual == block.expected:
            continue
        if not rewrite:
            raise TraceMismatchError(describe_mismatch(block, actual))
        replacements.append((block, actual))
    if replacements:
        for block, actual in reversed(replacements):
            lines[block.out_start : block.out_end] = list(actual)
        path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return len(blocks)
