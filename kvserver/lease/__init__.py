"""kvserver.lease: etcd's leases, replicated through raft (the lessor and its codecs)."""
