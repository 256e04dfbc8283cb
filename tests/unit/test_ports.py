"""Test servers' ports: never from the kernel's ephemeral range, never shared between workers."""

from __future__ import annotations

import socket

import pytest

from replaystore.testing import ports
from replaystore.testing.ports import find_free_port


def test_ports_are_below_the_ephemeral_range_and_not_handed_out_twice() -> None:
    start = ports._ephemeral_start()
    if start - ports._LOWEST < 2000:
        pytest.fail(f"this machine's ephemeral range starts at {start}: no pool below it")
    handed = [find_free_port() for _ in range(200)]
    assert len(set(handed)) == len(handed)
    assert all(ports._LOWEST <= port < start for port in handed)
    for port in handed[:20]:
        with socket.socket() as sock:
            sock.bind(("127.0.0.1", port))  # free when handed out, and still free


def test_each_xdist_worker_draws_from_its_own_share(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PYTEST_XDIST_WORKER_COUNT", "3")
    shares = []
    for worker in ("gw0", "gw1", "gw2"):
        monkeypatch.setenv("PYTEST_XDIST_WORKER", worker)
        shares.append(set(ports._share()))
    assert all(len(share) > 1000 for share in shares)
    assert not shares[0] & shares[1] and not shares[1] & shares[2] and not shares[0] & shares[2]
    assert max(max(share) for share in shares) < ports._ephemeral_start()


def test_a_port_that_is_taken_is_skipped() -> None:
    first = find_free_port()
    with socket.socket() as held:
        held.bind(("127.0.0.1", first + 1))
        held.listen()
        nxt = find_free_port()
    assert nxt != first + 1
