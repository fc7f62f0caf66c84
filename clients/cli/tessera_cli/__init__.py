"""``tessera``: the command line for a Tessera cluster, a client of its REST API only.

It imports nothing of the server (no Django): ``pip install ./clients/cli`` is all it needs.
"""

__version__ = "0.1.0"
