"""Test-wide fixtures come from plugins: real servers, and the ``realserver`` marker from their
use (``tests/plugins/servers.py``). The conformance suite's backend cases live beside it
(``tests/conformance/conftest.py``)."""

from __future__ import annotations

pytest_plugins = ["tests.plugins.servers", "pytester"]
