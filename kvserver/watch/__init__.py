"""kvserver.watch: the watch hub over the MVCC store (history replay and live events)."""
