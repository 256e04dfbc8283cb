"""Smoke tests for replaystore.testing: the real-server harness must itself work.

These start real redis-server / valkey-server processes, so they double as a
check that the binaries are installed and that nothing leaks after stop().
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
import redis
from redis.cluster import ClusterNode, RedisCluster

from replaystore.testing import start_replicated_pair
from replaystore.testing.servers import (
    ServerHandle,
    find_free_port,
    redis_server_binary,
    start_cluster,
    start_standalone,
    valkey_server_binary,
)

pytestmark = pytest.mark.realserver


def _client(handle: ServerHandle) -> redis.Redis:
    return redis.Redis.from_url(handle.url, decode_responses=True)


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


def _port_refuses(port: int) -> bool:
    try:
        socket.create_connection(("127.0.0.1", port), timeout=1).close()
    except ConnectionRefusedError:
        return True
    return False


def test_find_free_port_is_bindable() -> None:
    port = find_free_port()
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", port))


def test_standalone_redis_ping_set_get_stop() -> None:
    handle = start_standalone(redis_server_binary())
    root = handle._root
    try:
        assert handle.kind == "redis"
        assert handle.url == f"redis://127.0.0.1:{handle.ports[0]}/0"
        pids = handle.pids()
        assert len(pids) == 1
        assert _pid_alive(pids[0])
        client = _client(handle)
        try:
            assert client.ping() is True
            assert client.set("greeting", "hello") is True
            assert client.get("greeting") == "hello"
            info = client.info("server")
            assert "redis_version" in info
        finally:
            client.close()
    finally:
        handle.stop()
    assert handle.pids() == []
    assert not _pid_alive(pids[0])
    assert not root.exists()
    assert _port_refuses(handle.ports[0])
    handle.stop()  # idempotent


def test_valkey_standalone_reports_valkey() -> None:
    binary = valkey_server_binary()
    with start_standalone(binary, kind="valkey") as handle:
        client = _client(handle)
        try:
            info = client.info("server")
            assert info.get("server_name") == "valkey" or "valkey_version" in info, info
            assert client.set("k", "v") is True
            assert client.get("k") == "v"
        finally:
            client.close()
    assert handle.pids() == []


@pytest.mark.parametrize("flavor", ["redis", "valkey"])
def test_cluster_three_masters_cross_slot(flavor: str) -> None:
    binary = redis_server_binary() if flavor == "redis" else valkey_server_binary()
    started = time.monotonic()
    handle = start_cluster(binary)
    elapsed = time.monotonic() - started
    try:
        assert elapsed < 10, f"cluster start-up took {elapsed:.1f}s"
        assert handle.kind == "cluster"
        assert len(handle.ports) == 3
        assert len(set(handle.ports)) == 3
        assert len(handle.pids()) == 3
        assert handle.url == "redis+cluster://" + ",".join(
            f"127.0.0.1:{port}" for port in handle.ports
        )

        cluster = RedisCluster(
            startup_nodes=[ClusterNode("127.0.0.1", port) for port in handle.ports],
            decode_responses=True,
        )
        try:
            keys = [f"key-{i}" for i in range(30)]
            slots = {cluster.keyslot(key) for key in keys}
            owners = {cluster.get_node_from_key(key).port for key in keys}
            assert len(slots) > 1
            assert owners == set(handle.ports), "keys should land on all three masters"
            for key in keys:
                assert cluster.set(key, key.upper()) is True
            for key in keys:
                assert cluster.get(key) == key.upper()
        finally:
            cluster.close()

        for port in handle.ports:
            node = redis.Redis(host="127.0.0.1", port=port, decode_responses=True)
            try:
                info = node.execute_command("CLUSTER INFO")
            finally:
                node.close()
            assert info["cluster_state"] == "ok"
            assert int(info["cluster_known_nodes"]) == 3
            assert int(info["cluster_size"]) == 3
            assert int(info["cluster_slots_assigned"]) == 16384

        with pytest.raises(ValueError, match="standalone"):
            handle.restart()
    finally:
        handle.stop()
    assert handle.pids() == []


def test_restart_loses_data_on_same_port() -> None:
    with start_standalone(redis_server_binary()) as handle:
        port = handle.ports[0]
        (old_pid,) = handle.pids()
        client = _client(handle)
        try:
            client.set("doomed", "1")
            handle.restart()
            assert handle.ports == [port]
            assert handle.url == f"redis://127.0.0.1:{port}/0"
            (new_pid,) = handle.pids()
            assert new_pid != old_pid
            assert not _pid_alive(old_pid)
            # The pooled connection died with the old process; redis-py
            # reconnects once, to the new process on the same port.
            assert client.get("doomed") is None
            assert client.dbsize() == 0

            client.set("kept", "1")
            handle.restart(keep_data=True)
            assert handle.ports == [port]
            assert client.get("kept") == "1"
        finally:
            client.close()


def test_atexit_kills_forgotten_servers(tmp_path: Path) -> None:
    """A process that exits without stop() must not leave servers behind."""
    repo_root = Path(__file__).resolve().parents[2]
    script = textwrap.dedent(
        """
        from replaystore.testing.servers import redis_server_binary, start_standalone
        handle = start_standalone(redis_server_binary())
        print(handle.pids()[0], handle._root, flush=True)
        # no stop(): the atexit hook must clean up
        """
    )
    result = subprocess.run(
        [sys.executable, "-c", script],
        cwd=repo_root,
        capture_output=True,
        text=True,
        timeout=30,
        check=True,
    )
    pid_text, root = result.stdout.split()
    pid = int(pid_text)
    deadline = time.monotonic() + 5
    while _pid_alive(pid) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not _pid_alive(pid), "server outlived the interpreter that started it"
    assert not Path(root).exists()


def test_replicated_pair_replicates_and_stops_cleanly() -> None:
    pair = start_replicated_pair(redis_server_binary())
    pids = pair.primary.pids() + pair.replica.pids()
    try:
        assert len(pids) == 2
        primary, replica = _client(pair.primary), _client(pair.replica)
        try:
            primary.set("k", "v")
            pair.wait_in_sync()
            assert replica.get("k") == "v"
            assert replica.info("replication")["role"] == "slave"
        finally:
            primary.close()
            replica.close()
    finally:
        pair.stop()
    assert not any(_pid_alive(pid) for pid in pids)
    assert pair.primary.pids() == [] and pair.replica.pids() == []
    with pytest.raises(ConnectionRefusedError):
        socket.create_connection(pair.link.address, timeout=1).close()
