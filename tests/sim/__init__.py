"""Deterministic cluster simulation of the raft core with safety checkers (DESIGN section 7.3)."""
