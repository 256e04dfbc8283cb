"""Durable tasks (2026-07-28, the ``io.modelcontextprotocol/tasks`` extension) for the official SDK.

Loaded only by servers that serve tasks: a 2025-11-25 server never imports
this package nor the task store (:mod:`replaystore.taskstore`).
"""
