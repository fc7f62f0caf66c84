"""The simulator: a second driver around the engine, through simulated time (docs/formats.md)."""
