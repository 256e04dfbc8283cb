"""Replicas sharing one store: membership, the session registry, the bus between them.

Everything a replica must know about another one (which sessions exist, who
runs a request, who to wake up) goes through the store, so any replica can
serve any request and none is special.

Internal: what applications use is exported by :mod:`replaystore.mcp`.
"""
