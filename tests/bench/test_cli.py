"""``raftkv bench`` argument validation: bad usage is exit 2 with a clear message, no traffic."""

import pytest

from kvserver import cli


def run_cli(capsys, *argv):
    try:
        code = cli.main(["bench", *argv])
    except SystemExit as exc:  # argparse's own errors
        code = exc.code
    return code, capsys.readouterr().err


# An endpoint nothing listens on: a validation error must come before any connection.
DEAD = ["--endpoints", "http://127.0.0.1:9"]


@pytest.mark.parametrize(
    "argv, message",
    [
        (["put", "--clients", "2", "--conns", "3"], "--conns must be between 1 and --clients"),
        (["put", "--clients", "0"], "--clients must be at least 1"),
        (["put", "--key-size", "2", "--key-space-size", "1000"], "--key-size 2 is too small"),
        (["txn-put", "--dialect", "rest"], "txn-put needs --dialect v3"),
        (["watch-latency", "--dialect", "rest"], "watch-latency needs --dialect v3"),
        (["watch-latency", "--procs", "2", "--clients", "2"], "watch-latency runs in one process"),
        (["put", "--procs", "3", "--clients", "2"], "--procs must not exceed"),
        (["put", "--rate", "-1"], "--rate must be >= 0"),
        (["put", "--duration", "0"], "--duration must be positive"),
        (["mixed", "--read-ratio", "1.5"], "--read-ratio must be between 0 and 1"),
        (["txn-put", "--txn-ops", "3"], "--txn-ops must not exceed --key-space-size"),
        (["put", "--protocol", "grpc", "--dialect", "rest"], "--dialect rest is HTTP only"),
        (["watch-latency", "--protocol", "grpc"], "watch-latency runs over HTTP only"),
    ],
)
def test_bad_combinations_exit_2_with_the_reason(capsys, argv, message):
    code, err = run_cli(capsys, *argv, *DEAD)
    assert code == 2
    assert message in err and "Traceback" not in err


@pytest.mark.parametrize(
    "argv, message",
    [
        (["put", "--endpoints", "ftp://127.0.0.1:2379"], "expected http://HOST:PORT or https"),
        (
            ["put", "--endpoints", "https://127.0.0.1:2379", "--cert", "/no/such.pem"],
            "give both --cert and --key",
        ),
        (["put", "--endpoints", "127.0.0.1:2379"], "expected http://HOST:PORT"),
        (["put", "--endpoints", "http://127.0.0.1:99999"], "endpoint"),
    ],
)
def test_bad_endpoints(capsys, argv, message):
    code, err = run_cli(capsys, *argv)
    assert code == 2 and message in err


@pytest.mark.parametrize(
    "argv",
    [
        ["put", "--total", "10", "--duration", "1"],  # mutually exclusive
        ["put", "--consistency", "x"],
        ["put", "--dialect", "grpc"],
        ["put", "--protocol", "h3"],
        ["put", "--clients", "many"],
        ["frobnicate"],
    ],
)
def test_argparse_rejects(capsys, argv):
    code, err = run_cli(capsys, *argv, *DEAD)
    assert code == 2 and "usage:" in err


def test_unreachable_endpoint_is_an_error_not_a_traceback(capsys):
    code, err = run_cli(capsys, "put", "--total", "5", *DEAD)
    assert code == 1 and err.startswith("Error: cannot connect")


def test_unreachable_grpc_endpoint_is_an_error_not_a_traceback(capsys):
    code, err = run_cli(capsys, "put", "--total", "5", "--protocol", "grpc", *DEAD)
    assert code == 1 and err.startswith("Error: cannot connect")
