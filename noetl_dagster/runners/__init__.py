"""The local runner: the composition root that wires the engine to its adapters.

``runners.local`` builds the services an execution needs (event store, payload
store, keychain providers, lineage listeners) and drives the engine in this
process. The Dagster runner (``translator.runner``) runs the same engine through
Dagster jobs and uses the same wiring (``build_services``).
"""
