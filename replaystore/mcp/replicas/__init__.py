"""Replicas sharing one store: membership, and which replica a client message belongs to.

Everything a replica must know about another one (which sessions exist, who
runs a request, who to wake up) goes through the store, so any replica can
serve any request and none is special. The session registry and the bus
between replicas are built by the store's backend
(:mod:`replaystore.backends.coordination`).

Internal: what applications use is exported by :mod:`replaystore.mcp`.
"""
