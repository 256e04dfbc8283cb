"""Benchmarks of replaystore against raw Redis commands and against FastMCP 4's EventStore.

Run from the repository root (``replaystore.testing`` starts the Redis server)::

    python -m benchmarks.run [--quick] [--json out.json]

Every speed and memory figure is a ratio to a raw baseline measured in the
same run, with the same kind of client and the same connection style.
"""
