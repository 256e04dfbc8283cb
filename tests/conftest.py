"""Test-wide fixtures come from plugins: real servers, and the ``realserver`` marker from their
use (``tests/plugins/servers.py``); the order modules are dealt out to xdist workers
(``tests/plugins/schedule.py``). The conformance suite's backend cases live beside it
(``tests/conformance/conftest.py``)."""

from __future__ import annotations

pytest_plugins = ["tests.plugins.servers", "tests.plugins.schedule", "pytester"]
