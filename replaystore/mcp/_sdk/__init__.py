"""Where this package leans on the MCP SDK's private parts: every name checked, every override.

Private to :mod:`replaystore.mcp`: nothing here is meant to be imported by
applications.
"""
