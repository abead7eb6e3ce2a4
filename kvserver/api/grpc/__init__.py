"""kvserver.api.grpc: etcd's gRPC API (``etcdserverpb``) over the same ``KVService``.

``GrpcServer`` (``server``) holds the services' method table; ``mux`` hands every client-URL
connection that opens with the HTTP/2 preface to it, and ``connection`` serves that
connection's calls on the member's event loop (``h2``: frames and header blocks; ``rpc``: a
call's context and status). One module per etcd
service (``kv``, ...); ``convert`` translates messages to the service's dataclasses and back;
``calls`` resolves the caller and turns errors into etcd's gRPC statuses.
"""
