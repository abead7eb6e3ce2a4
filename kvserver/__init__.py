"""kvserver: everything that runs — node driver, transport, store, HTTP API, client, CLI."""
