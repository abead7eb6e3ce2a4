"""snap package (being built)."""
