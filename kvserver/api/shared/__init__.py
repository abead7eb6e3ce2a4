"""What both client dialects use (``kvserver.api.http`` and ``kvserver.api.grpc``), so that
neither imports the other: request sizes, and finding the leader a follower forwards to.
"""
