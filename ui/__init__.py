"""The web UI (one module per tab, each with build() and wire(parts, store)) and the REST API (api.py).

Handlers read and write only the store; generation happens in the worker process.
"""
