"""kvserver.membership: member identity and how a member learns it at start, the replicated
member registry, etcd's reconfiguration checks and the member service."""
