"""raft package (being built)."""
