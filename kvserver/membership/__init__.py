"""kvserver.membership: member identity, the replicated member registry and the member service."""
