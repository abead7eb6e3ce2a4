"""kvserver.server: the server core — the raft driver and its durable storage, the replicated
KV state machine, the service interface both API dialects call, config, metrics, compaction."""
