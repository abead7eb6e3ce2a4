"""``raftkv bench --protocol grpc`` and ``grpc-lean``: the same workloads as etcd's KV gRPC
calls, through grpc.aio with the generated stubs or through the lean HTTP/2 client, against
an in-process raftkv cluster and a real etcd. Counts, never timings."""

import pytest

from kvserver.bench.result import find_leader
from kvserver.bench.runner import run
from kvserver.bench.workloads import BenchOptions
from tests.etcd_process import etcd_process
from tests.support.bench_cli import bench_json, put_200_through_the_cli

CLIENTS = pytest.mark.parametrize("protocol", ["grpc", "grpc-lean"])


@CLIENTS
def test_grpc_puts_through_the_cli_are_counted_and_applied_once(capsys, inproc_cluster, protocol):
    doc = put_200_through_the_cli(capsys, inproc_cluster, protocol=protocol)
    assert doc["options"]["protocol"] == protocol


@CLIENTS
def test_every_grpc_workload_counts_its_calls(inproc_cluster, protocol):
    eps = inproc_cluster.endpoints
    cases = [
        dict(op="range", consistency="l"),
        dict(op="range", consistency="s"),
        dict(op="txn-put", txn_ops=3, key_space_size=10),
        dict(op="mixed", read_ratio=0.5, key_space_size=10),
        dict(op="put", sequential_keys=True, key_space_size=7, conns=1),
    ]
    for case in cases:
        opts = BenchOptions(
            **{"endpoints": eps, "clients": 4, "total": 60, "protocol": protocol, **case}
        ).validate()
        r = run(opts)
        assert (r.stats.count, r.stats.error_count) == (60, 0), (case, r.stats.errors)
    leader = find_leader(eps)
    before = inproc_cluster.revision()
    r = run(
        BenchOptions(
            op="txn-put",
            endpoints=eps,
            clients=2,
            total=10,
            txn_ops=3,
            key_space_size=10,
            target_leader=True,
            protocol=protocol,
        ).validate()
    )
    assert r.endpoints_used == [leader]
    assert (r.stats.count, r.stats.error_count) == (10, 0)
    assert inproc_cluster.revision() == before + 10  # one revision per txn


def test_grpc_errors_are_counted_by_status(inproc_cluster):
    """A put larger than --max-request-bytes: every call fails with etcd's status and text,
    counted in the error distribution as HTTP errors are."""
    r = run(
        BenchOptions(
            op="put",
            endpoints=inproc_cluster.endpoints,
            clients=2,
            total=6,
            val_size=1792 * 1024,  # over 1.5 MiB, under gRPC's own message limit
            protocol="grpc",
        ).validate()
    )
    assert r.stats.count == 0
    assert dict(r.stats.errors) == {"gRPC INVALID_ARGUMENT: etcdserver: request is too large": 6}


def test_the_lean_client_counts_errors_by_status(inproc_cluster):
    """A txn over --max-txn-ops: every call fails with etcd's status and text, as through
    grpc.aio (the lean client sends messages up to one frame, so not a too-large request)."""
    r = run(
        BenchOptions(
            op="txn-put",
            txn_ops=200,
            key_space_size=400,
            val_size=8,
            endpoints=inproc_cluster.endpoints,
            clients=2,
            total=6,
            protocol="grpc-lean",
        ).validate()
    )
    assert r.stats.count == 0
    assert dict(r.stats.errors) == {
        "gRPC INVALID_ARGUMENT: etcdserver: too many operations in txn request": 6
    }


@pytest.mark.external
@CLIENTS
def test_the_same_grpc_load_generator_drives_a_real_etcd(tmp_path, capsys, protocol):
    with etcd_process(str(tmp_path)) as etcd:
        code, doc, err = bench_json(
            capsys,
            "put",
            "--total",
            "300",
            "--clients",
            "16",
            "--conns",
            "4",
            "--procs",
            "2",
            "--key-space-size",
            "20",
            "--sequential-keys",
            "--endpoints",
            etcd.url,
            protocol=protocol,
        )
        assert code == 0, err
        assert doc["count"] == 300 and doc["errors"] == 0
        got = etcd.post("/v3/kv/range", {"key": "MA==", "range_end": "Og=="})  # "0".. ":"
        assert got["count"] == "20"  # sequential keys over both processes covered the space
        assert int(got["header"]["revision"]) == 1 + 300  # each put applied once
        r = run(
            BenchOptions(
                op="range", endpoints=[etcd.url], clients=4, total=50, protocol=protocol
            ).validate()
        )
        assert (r.stats.count, r.stats.error_count) == (50, 0)
