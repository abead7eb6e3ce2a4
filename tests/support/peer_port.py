"""A ``PeerTransport``'s routes served on 127.0.0.1, for transport tests without a member."""

from aiohttp import web

from kvserver.rafthttp.transport import PeerTransport


async def serve_peer_port(transport: PeerTransport, port: int) -> web.AppRunner:
    """The transport's routes on ``127.0.0.1:port``; ``await runner.cleanup()`` stops them."""
    app = web.Application()
    app.add_routes(transport.routes())
    runner = web.AppRunner(app, handle_signals=False, shutdown_timeout=0.5)
    await runner.setup()
    await web.TCPSite(runner, "127.0.0.1", port).start()
    return runner
