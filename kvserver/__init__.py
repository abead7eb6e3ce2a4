"""kvserver: everything that runs — node driver, transport, store, HTTP API, client, CLI."""

from kvserver import native as _native

# Before any of the compiled modules is imported: all of them compiled, or all from source.
_native.install()
