"""kvserver.rafthttp: raft messages between members over HTTP (streams, snapshots, checks)."""
