"""The leader a follower forwards a leader-only request to, in either dialect."""

from __future__ import annotations

from typing import Any

from kvserver.lease.errors import MSG_NOT_LEADER

FORWARD_TIMEOUT_S = 15.0

__all__ = ["FORWARD_TIMEOUT_S", "MSG_NOT_LEADER", "leader_client_url"]


def leader_client_url(service: Any) -> str | None:
    """The leader's first client URL, if the leader is another member that published one."""
    status = service.status()
    for m in getattr(status, "members", ()):
        if m.id == status.leader and m.id != status.member_id and m.client_urls:
            return m.client_urls[0]
    return None
