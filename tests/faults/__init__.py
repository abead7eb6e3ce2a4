"""Disk and clock faults under real member processes (docs/reliability.md, the fault matrix)."""
