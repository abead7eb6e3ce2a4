"""kvserver.localcluster: a local cluster of real member processes (``raftkv cluster up``)."""
