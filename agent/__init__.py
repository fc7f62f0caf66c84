"""Tessera's node agent: registers a node, heartbeats, runs its jobs, serves its GPU metrics.

Run it with ``python -m agent --server URL [--simulate SPEC]`` (see ``agent.cli`` and
``docs/agent.md``). It imports no Django: it talks to the control plane over HTTP only.
"""
