"""kvserver.api.grpc: etcd's gRPC API (``etcdserverpb``) over the same ``KVService``.

``GrpcServer`` (``server``) runs grpc.aio on an abstract unix socket; ``mux`` lets every client URL
serve it beside the HTTP API (HTTP/2 connections are spliced to it). One module per etcd
service (``kv``, ...); ``convert`` translates messages to the service's dataclasses and back;
``calls`` resolves the caller and turns errors into etcd's gRPC statuses.
"""
