"""A redis-py the Redis backend cannot use is named, with the version it needs.

Each case runs in a fresh interpreter whose path holds another redis-py: a
distribution record of an older version shadowing the installed one (what
``pip`` would report), a stub package lacking ``redis.maint_notifications``,
or no redis-py at all.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest
import redis

from replaystore.backends import redis as redis_backend
from replaystore.backends.redis import TESTED_REDIS

ROOT = Path(__file__).resolve().parents[2]
SITE = Path(redis.__file__).resolve().parents[1]  # where the installed redis-py lives

# What the child prints: the message of from_url's error, and of importing the backend directly.
PROBE = """
import json
from replaystore import ReplayBuffer, UnsupportedURLError
out = {}
try:
    ReplayBuffer.from_url("redis://127.0.0.1:1")
except UnsupportedURLError as exc:
    out["from_url"] = str(exc)
try:
    import replaystore.backends.redis
except ImportError as exc:
    out["import"] = str(exc)
print(json.dumps(out))
"""


def _dist_info(path: Path, version: str) -> None:
    record = path / f"redis-{version}.dist-info"
    record.mkdir(parents=True)
    (record / "METADATA").write_text(f"Metadata-Version: 2.1\nName: redis\nVersion: {version}\n")


def _stub_package(path: Path, version: str) -> None:
    """A ``redis`` package with nothing in it (no ``maint_notifications``, no ``asyncio``)."""
    (path / "redis").mkdir(parents=True)
    (path / "redis" / "__init__.py").write_text('"""A redis-py stub."""\n')
    _dist_info(path, version)


def _probe(*path: Path, isolated: bool = False) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    env["PYTHONPATH"] = os.pathsep.join(str(p) for p in path)
    # -S: no site-packages (only what PYTHONPATH names), for a world without redis-py.
    flags = ["-S"] if isolated else []
    done = subprocess.run(
        [sys.executable, *flags, "-c", PROBE],
        env=env,
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)  # type: ignore[no-any-return]


def _assert_names_versions(out: dict[str, str], installed: str, *, direct: bool) -> None:
    want = f"needs redis-py {TESTED_REDIS}, but redis-py {installed} is installed"
    assert want in out["from_url"]
    assert f"pip install 'redis{TESTED_REDIS}'" in out["from_url"]
    assert "replaystore[redis]" not in out["from_url"]
    if direct:
        assert want in out["import"] and "replaystore[redis]" not in out["import"]


@pytest.mark.parametrize("installed", ["5.0.0", "6.4.0", "7.4.0", "8.0.1"])
def test_an_older_redis_py_is_named_with_the_version_needed(tmp_path, installed):
    """Its record shadows the installed one: both the URL and a direct import say what is wrong.

    7.x and 8.0 import fine and would fail only at the first connection, with
    an unknown keyword argument; the check must catch them before.
    """
    _dist_info(tmp_path, installed)
    _assert_names_versions(_probe(tmp_path), installed, direct=True)


def test_a_redis_py_without_maint_notifications_is_not_told_to_install_the_extra(tmp_path):
    _stub_package(tmp_path, "6.4.0")
    _assert_names_versions(_probe(tmp_path), "6.4.0", direct=False)


def test_a_broken_redis_py_of_a_tested_version_shows_the_failed_import(tmp_path):
    _stub_package(tmp_path, "8.1.0")
    out = _probe(tmp_path)
    assert "redis-py 8.1.0 is installed, but the Redis backend cannot import it" in out["from_url"]
    assert "No module named 'redis." in out["from_url"]


def test_without_redis_py_the_extra_is_named(tmp_path):
    """A copy of the environment's path without redis-py, hiredis and their records."""
    mirror = tmp_path / "site"
    mirror.mkdir()
    for entry in SITE.iterdir():
        if not entry.name.lower().startswith(("redis", "hiredis", "_redis", "__editable__")):
            (mirror / entry.name).symlink_to(entry)
    out = _probe(ROOT, mirror, isolated=True)
    assert "pip install 'replaystore[redis]'" in out["from_url"]
    assert "redis" in out["import"]


def test_tested_range_is_the_extra_pinned_in_the_package_metadata():
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    assert project["optional-dependencies"]["redis"] == [f"redis[hiredis]{TESTED_REDIS}"]


def test_the_installed_redis_py_is_one_of_the_tested_range():
    """The suite runs on a tested redis-py, so the check lets it through."""
    lowest, below = re.fullmatch(r">=([\d.]+),<([\d.]+)", TESTED_REDIS).groups()  # type: ignore[union-attr]
    installed = redis_backend._release(redis.__version__)
    assert redis_backend._release(lowest) <= installed < redis_backend._release(below)
    redis_backend.require()
