"""The compose target's plumbing without Docker: which faults it runs, what it refuses, and
how it tells a member killed by the nemesis from one that exited by itself (the Docker run
itself is test_chaos_compose.py)."""

from __future__ import annotations

import pytest

from tests.chaos.docker_members import UNSUPPORTED_FAULTS, DockerCluster, DockerMember
from tests.chaos.nemesis import ALL_FAULTS
from tests.chaos.runner import ChaosConfig, ChaosUnavailable, compose_faults, run


def test_families_leave_out_the_single_pair_cut_and_naming_it_is_refused():
    faults, left_out = compose_faults("all")
    assert faults == [f for f in ALL_FAULTS if f != "partition-bridge"]
    assert left_out == UNSUPPORTED_FAULTS
    assert compose_faults("kill,pause") == (
        ["kill-leader", "kill-follower", "pause-leader", "pause-follower"],
        {},
    )
    with pytest.raises(ChaosUnavailable, match="partition-bridge"):
        compose_faults("kill,partition-bridge")
    with pytest.raises(ValueError, match="unknown nemesis"):
        compose_faults("kill,flood")


def test_server_flags_are_refused_for_containers(tmp_path):
    cfg = ChaosConfig(
        target="compose",
        nemesis="kill",
        out_dir=str(tmp_path),
        extra_args=["--election-timeout=500"],
    )
    with pytest.raises(ValueError, match="process target"):
        run(cfg)
    with pytest.raises(ValueError, match="unknown target"):
        run(ChaosConfig(target="vm", out_dir=str(tmp_path)))


def _cluster(states: dict[str, dict]) -> DockerCluster:
    c = DockerCluster.__new__(DockerCluster)  # no Docker: only the bookkeeping
    c.members = [
        DockerMember(
            i,
            f"raftkv{i + 1}",
            "127.0.0.1",
            1,
            2380,
            "",
            "",
            [],
            container=f"c{i}",
            started_at="t0",
        )
        for i in range(3)
    ]
    c._states = lambda: states
    return c


def test_exited_names_crashed_and_restarted_members_not_killed_or_paused_ones():
    states = {
        "c0": {"Running": False, "StartedAt": "t0"},  # killed by the nemesis
        "c1": {"Running": True, "StartedAt": "t0"},  # paused: still running
        "c2": {"Running": True, "StartedAt": "t0"},
    }
    c = _cluster(states)
    c.members[0].dead = True
    c.members[1].paused = True
    assert c.exited() == []
    assert not c.members[0].alive() and c.members[1].alive()
    assert not c.members[1].running() and c.members[2].running()
    states["c2"] = {"Running": True, "StartedAt": "t1"}  # the restart policy restarted it
    assert [m.name for m in c.exited()] == ["raftkv3"]
    states["c2"] = {"Running": False, "StartedAt": "t0"}  # exited, not restarted (yet)
    assert [m.name for m in c.exited()] == ["raftkv3"]


def test_docker_timestamps_with_nanoseconds_become_epoch_seconds():
    from tests.chaos.docker_members import _wall_clock

    assert _wall_clock("2026-11-25T00:03:12.123456789Z") == pytest.approx(1795564992.123456)
    assert _wall_clock("2026-11-25T00:03:12Z") == 1795564992.0
