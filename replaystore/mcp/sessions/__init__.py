"""Sessions of the 2025-11-25 revision, kept in the store so any replica serves any of them.

The session manager adopts the SDK's, the transport resumes streams only when
the store proves the replay exact, and the event store (:mod:`.event_store`)
keeps every event in a :class:`~replaystore.ReplayBuffer`. Live streams
(:mod:`.live`, :mod:`.tail`), request leases (:mod:`.leases`: a request sent
again, a request whose replica stopped) and the error responses
(:mod:`.error_responses`) each have a module here.

Internal: what applications use is exported by :mod:`replaystore.mcp`.
"""
