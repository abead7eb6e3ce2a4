"""kvserver.assembly: build one member from its parts and run it (``raftkv serve``)."""
