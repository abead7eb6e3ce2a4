"""``raftkv serve`` serves clients from front-end processes unless told otherwise.

``--client-frontends`` takes N or ``auto`` (one per core beyond the first, at least one),
and ``auto`` is what a member started from the command line gets; a ``ServerConfig`` built
in code (embedding, in-process tests) keeps the one-process member. ``--grpc-frontends`` is
the flag's old name. The budgets' flags reach the config as given.
"""

import argparse
import os

import pytest

from kvserver.api.grpc.budgets import Http2Limits
from kvserver.assembly.member import client_limits
from kvserver.membership.identity import ClusterConfigError
from kvserver.server.config import (
    MAX_GRPC_FRONTENDS,
    ServerConfig,
    add_server_flags,
    client_frontends_auto,
    config_from_args,
)


def cfg(*argv: str, env: dict[str, str] | None = None) -> ServerConfig:
    parser = argparse.ArgumentParser()
    add_server_flags(parser)
    return config_from_args(parser.parse_args(list(argv)), env or {})


def test_the_command_line_default_is_auto_and_code_keeps_one_process():
    cores = len(os.sched_getaffinity(0))
    assert client_frontends_auto() == max(1, min(MAX_GRPC_FRONTENDS, cores - 1))
    assert cfg().grpc_frontends == client_frontends_auto()
    assert ServerConfig().grpc_frontends == 0


@pytest.mark.parametrize(
    ("argv", "env", "want"),
    [
        (["--client-frontends", "0"], {}, 0),
        (["--client-frontends", "3"], {}, 3),
        (["--client-frontends", "AUTO"], {}, None),
        (["--grpc-frontends", "2"], {}, 2),
        ([], {"RAFTKV_CLIENT_FRONTENDS": "0"}, 0),
    ],
)
def test_client_frontends_flag(argv, env, want):
    expected = client_frontends_auto() if want is None else want
    assert cfg(*argv, env=env).grpc_frontends == expected


def test_bad_frontend_counts_are_refused():
    with pytest.raises(ClusterConfigError, match="--client-frontends"):
        cfg("--client-frontends", "many")
    with pytest.raises(ClusterConfigError, match="at most"):
        cfg("--client-frontends", str(MAX_GRPC_FRONTENDS + 1))


def test_budget_flags_reach_the_config():
    c = cfg("--max-concurrent-streams", "10", "--client-max-resets-per-second", "5")
    assert (c.max_concurrent_streams, c.client_max_resets_per_second) == (10, 5)


def test_the_budgets_defaults_are_the_flags_defaults():
    """The flags' defaults (the config) and the protocol's (Http2Limits) are one set."""
    assert client_limits(ServerConfig()) == Http2Limits()
