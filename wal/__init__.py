"""wal package (being built)."""
