"""Tessera's scheduling engine: pure Python, no Django, no I/O.

The live system (``scheduling.services.passes``) and the simulator (``scheduling.sim``) are two
drivers around the same code. Inputs are the frozen dataclasses of :mod:`.types`; decisions come out.
"""
