"""The Redis ACL rule of ``docs/deployment.md``, tested: enough for an MCP session, and each
permission it grants needed (taken away, the start-up check and the health check name it).
"""

from __future__ import annotations

import re
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import anyio
import httpx
import pytest
import redis

from replaystore import ReplayBuffer
from replaystore.backends.coordination import coordination_of
from replaystore.mcp.preflight import Problem, check_store
from replaystore.testing.mcp import initialize_message
from replaystore.testing.servers import ServerHandle
from replaystore.testing.sse import sse_events
from tests.mcp._support import RawSession, result_text, spawn_many, spawn_replica, wait_ready
from tests.plugins.servers import RealServers

pytestmark = pytest.mark.anyio

ROOT = Path(__file__).resolve().parents[2]
PREFIX = "acl:"


def documented_rule() -> list[str]:
    """The ``ACL SETUSER`` arguments after the user name, from docs/deployment.md, for PREFIX."""
    text = (ROOT / "docs" / "deployment.md").read_text()
    found = re.search(r"^ACL SETUSER replaystore (.+)$", text, re.MULTILINE)
    assert found is not None, "docs/deployment.md lists no ACL SETUSER line"
    return found.group(1).replace("replaystore:", PREFIX).split()


@pytest.fixture(scope="module")
def acl_redis(real_servers: RealServers) -> Iterator[ServerHandle]:
    handle = real_servers.own("redis")
    yield handle
    handle.stop()


def user(handle: ServerHandle, name: str, *changes: str) -> str:
    """A user with the documented rule, then ``changes``; its store URL."""
    rule = [">pw" if part == ">PASSWORD" else part for part in documented_rule()]
    admin = redis.Redis(host="127.0.0.1", port=handle.ports[0])
    admin.execute_command("ACL", "SETUSER", name, "reset", *rule, *changes)  # type: ignore[no-untyped-call]
    return f"redis://{name}:pw@127.0.0.1:{handle.ports[0]}/0?prefix={PREFIX}"


async def test_the_documented_rule_serves_an_mcp_session(
    acl_redis: ServerHandle, http: httpx.AsyncClient, tmp_path: Path
) -> None:
    url = user(acl_redis, "replaystore")
    assert not [p for p in await _problems(url) if p.fatal]
    server = spawn_replica("acl", url, tmp_path)
    try:
        wait_ready([server])
        assert (await http.get(f"{server.base}/healthz")).status_code == 200
        session = await RawSession(http, server.url).initialize()
        request_id, body = session.call("countdown", {"n": 3, "interval_ms": 0}, token="t")
        with anyio.fail_after(15):
            async with session.post(body) as response:
                events = [event async for event in sse_events(response)]
            assert [result_text(e, request_id) for e in events][-1] == "done 3"
            cursor = next(e.id for e in events if e.priming and e.id)
            async with session.get(cursor) as response:  # a resume
                assert response.status_code == 200
                replayed = [e async for e in sse_events(response)]
        assert result_text(replayed[-1], request_id) == "done 3"
        assert "Traceback" not in server.log_tail(200)
    finally:
        server.stop()


@pytest.mark.parametrize(
    ("name", "change", "named"),
    [
        ("no-scripting", "-@scripting", "'eval' command"),
        ("no-time", "-time", "'TIME' command"),
        ("no-publish", "-publish", "'publish' command"),
        ("no-subscribe", "-subscribe", "'subscribe' command"),
        ("other-keys", "resetkeys ~other:*", "keys"),
        ("other-channels", "resetchannels &other:*", "channels"),
    ],
)
async def test_each_permission_taken_away_is_named_at_start_up(
    acl_redis: ServerHandle, name: str, change: str, named: str
) -> None:
    problems = await _problems(user(acl_redis, name, *change.split()))
    fatal = [p.text for p in problems if p.fatal]
    assert len(fatal) == 1, problems
    assert "forbids it (ACL)" in fatal[0] and named in fatal[0], fatal[0]


@pytest.mark.parametrize(
    "command",
    [["-m", "replaystore", "example-server"], ["-m", "replaystore.mcp.example"]],
    ids=["example-server", "module"],
)
def test_the_example_server_refuses_to_start_in_one_line(
    acl_redis: ServerHandle, command: list[str]
) -> None:
    """Both command lines run the same start-up check."""
    url = user(acl_redis, "cli-no-time", "-time")
    out = subprocess.run(
        [sys.executable, *command, "--port", "0", "--url", url],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert out.returncode == 2, out.stdout + out.stderr
    lines = out.stderr.splitlines()
    assert len(lines) == 1 and "'TIME' command" in lines[0], out.stderr


async def test_health_and_initialize_name_a_forbidden_command(
    acl_redis: ServerHandle, http: httpx.AsyncClient, tmp_path: Path
) -> None:
    """An app served without the start-up check (``build_app``, as a library serves its own).

    Its session manager checks the store in the background: unhealthy, 503s.
    """
    url = user(acl_redis, "health-no-time", "-time")
    server = spawn_many("no-time", {"no-time": ("sdk", url, 10_000)}, tmp_path)["no-time"]
    try:
        wait_ready([server])
        with anyio.fail_after(10):
            for _ in range(100):  # the start-up check runs in the background
                health = await http.get(f"{server.base}/healthz")
                if health.status_code != 200:
                    break
                await anyio.sleep(0.1)
        assert health.status_code == 503 and "'TIME' command" in health.text, health.text
        response = await http.post(
            server.url,
            json=initialize_message(),
            headers=RawSession(http, server.url).headers(),
        )
        assert response.status_code == 503, response.text
        assert response.headers["retry-after"] == "1"
        assert "forbids it (ACL)" in response.json()["error"]["message"]
    finally:
        server.stop()


async def _problems(url: str) -> list[Problem]:
    async with ReplayBuffer.from_url(url) as buffer:
        return list(await check_store(buffer, coordination_of(buffer.backend), seconds=5.0))
