"""Configurations of a three-member cluster that runs in one event loop (tests only)."""

from kvserver.localcluster.launcher import free_ports
from kvserver.membership.registry import parse_initial_cluster
from kvserver.server.config import ServerConfig


def configs(tmp_path, prefix: str = "m", token: str = "inproc", **overrides) -> list[ServerConfig]:
    """Three members on free loopback ports with fast ticks (20 ms heartbeat, 200 ms
    election), data under ``tmp_path``; ``overrides`` are further ``ServerConfig`` fields."""
    ports = free_ports(6)
    initial = ",".join(f"{prefix}{i}=http://127.0.0.1:{ports[2 * i + 1]}" for i in range(3))
    members = tuple(parse_initial_cluster(initial, token))
    out = []
    for i in range(3):
        client = (f"http://127.0.0.1:{ports[2 * i]}",)
        peer = (f"http://127.0.0.1:{ports[2 * i + 1]}",)
        out.append(
            ServerConfig(
                name=f"{prefix}{i}",
                data_dir=str(tmp_path / f"{prefix}{i}"),
                listen_client_urls=client,
                advertise_client_urls=client,
                listen_peer_urls=peer,
                initial_advertise_peer_urls=peer,
                initial_cluster=initial,
                initial_cluster_token=token,
                heartbeat_interval_ms=20,
                election_timeout_ms=200,
                members=members,
                **overrides,
            )
        )
    return out
