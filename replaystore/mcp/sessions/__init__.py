"""Sessions of the 2025-11-25 revision, kept in the store so any replica serves any of them.

The session manager adopts the SDK's, the transport resumes streams only when
the store proves the replay exact, and the event store (:mod:`.view`) keeps
every event in a :class:`~replaystore.ReplayBuffer`. Live tails, lost
requests and requests sent again each have a module here.

Internal: what applications use is exported by :mod:`replaystore.mcp`.
"""
