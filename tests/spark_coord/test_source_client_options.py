"""The data source's TLS and auth options reach the client of every process of a job
(``SourceOptions.client_options``); half-given pairs are refused before anything runs."""

import pytest

from kvserver.spark.source.options import OptionError, parse

BASE = {"endpoints": "https://raftkv1:2379", "prefix": "jobs/"}


def test_tls_files_and_user_reach_the_client():
    o = parse(
        {
            **BASE,
            "caFile": "/etc/raftkv/ca.pem",
            "certFile": "/etc/raftkv/client.pem",
            "keyFile": "/etc/raftkv/client-key.pem",
            "user": "spark",
            "password": "s3cret",
        }
    )
    assert o.client_options() == {
        "timeout_s": 30.0,
        "attempt_timeout_s": 10.0,
        "ca_file": "/etc/raftkv/ca.pem",
        "cert_file": "/etc/raftkv/client.pem",
        "key_file": "/etc/raftkv/client-key.pem",
        "user": "spark",
        "password": "s3cret",
    }


def test_without_them_the_client_gets_only_timeouts():
    assert parse(BASE).client_options() == {"timeout_s": 30.0, "attempt_timeout_s": 10.0}


@pytest.mark.parametrize(
    "extra",
    [{"user": "spark"}, {"password": "x"}, {"user": "", "password": "x"}, {"keyFile": "k.pem"}],
)
def test_half_given_pairs_are_refused(extra):
    with pytest.raises(OptionError):
        parse({**BASE, **extra})
