"""kvserver.kvpb: the wire contract between raftkv's clients and members.

Requests, responses, KeyValue and Event, errors with etcd's texts and gRPC codes, lease,
member and watch messages, and the HTTP header names. A leaf: it imports nothing of ours, so
the client library (and every Spark worker) loads it without the server."""
