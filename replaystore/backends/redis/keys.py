"""Every Redis key and pub/sub channel name replaystore uses, spelled in one place.

``docs/data-layout.md`` draws what each key holds. The names are the stored
format: a Redis written by one version must stay readable by the next, and
replicas of two versions share a store during a rolling upgrade, so changing
a name here changes the data layout.

Two roots:

- a session's keys, and the keys other parts keep beside them, start with
  the session's *base* ``<prefix>{<session>}`` (:func:`base`). Redis Cluster
  hashes the text between the braces, so they all land in one slot and one
  script may touch them all. Other shared keys (listen events, tasks) take a
  base of their own the same way.
- channels, and the one key no slot matters for, hang off the prefix alone.

The parts replicas coordinate through
(:class:`~replaystore.backends.redis.coordination.OnRedis` and the modules
beside it) take their bases from the backend's ``key_base`` (a backend of
another author may tag differently) and the rest of each name from here.
Only code under ``backends/redis/`` imports this module: nothing else of the
package knows a Redis key.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable

__all__ = [
    "DEFAULT_PREFIX",
    "SESSION",
    "all_channel",
    "base",
    "listen",
    "matching",
    "meta",
    "probe_channel",
    "registry",
    "registry_end",
    "registry_lease",
    "replica_channel",
    "request_state",
    "request_state_used",
    "run_index",
    "sequence",
    "session_channel",
    "session_keys",
    "store_era",
    "store_marker",
    "swept",
    "task_event_channels",
    "task_index",
    "task_keys",
    "task_nudges",
    "teardown_keys",
    "tombstone",
]

#: The prefix of every name when the URL names none.
DEFAULT_PREFIX = "replaystore:"

KeyBase = Callable[[str], str]


def base(prefix: str, name: str) -> str:
    """``<prefix>{<name>}``: the start of every key of session ``name``, hash tag included.

    Braces in ``name`` would cut the tag short (or empty it, spreading the keys
    over several slots), so such a name is written as hex behind a space,
    which no session id can contain.
    """
    tag = name if "{" not in name and "}" not in name else " " + name.encode().hex()
    return f"{prefix}{{{tag}}}"


# -- a session's events (the backend, its fast read, its teardowns, the Lua scripts)

#: The suffixes of a session's fixed keys, in the order every script declares
#: them (``KEYS[1]`` to ``KEYS[7]``); the lists of its sequences follow.
SESSION = ("m", "i", "g", "t", "k", "k2", "x")


def meta(base: str) -> str:
    """The meta hash: the session's bookkeeping and one field per sequence."""
    return f"{base}:m"


def run_index(base: str) -> str:
    """The run index: which positions each sequence holds."""
    return f"{base}:i"


def swept(base: str) -> str:
    """The tags of the lists that still hold evicted elements."""
    return f"{base}:g"


def tombstone(base: str) -> str:
    """Why a session ended, kept after its other keys are gone."""
    return f"{base}:t"


def sequence(base: str, tag: str) -> str:
    """The list of one sequence's events."""
    return f"{base}:q:{tag}"


def session_keys(base: str, tags: Iterable[str] = ()) -> list[str]:
    """A script's ``KEYS``: the fixed keys in order, then the lists of ``tags``."""
    return [f"{base}:{name}" for name in SESSION] + [f"{base}:q:{tag}" for tag in tags]


def teardown_keys(base: str, tags: Iterable[str]) -> list[str]:
    """Every key a teardown deletes: all but the tombstone it leaves, and the lists of ``tags``."""
    return [f"{base}:{name}" for name in SESSION if name != "t"] + [
        f"{base}:q:{tag}" for tag in tags
    ]


def matching(base: str) -> str:
    """A ``SCAN`` pattern matching every key under ``base`` and nothing else."""
    return "".join("\\" + c if c in "*?[]\\" else c for c in base) + "*"


# -- replicas of an MCP server: the session registry (beside the session's keys)


def registry(base: str) -> str:
    """The session's record: which replica runs it, and its streams."""
    return f"{base}:mcp"


def registry_lease(base: str, stream: str) -> str:
    """The lease of the replica serving request stream ``stream``."""
    return f"{base}:mcp:lease:{stream}"


def registry_end(base: str, stream: str) -> str:
    """The claim of the replica that ends request stream ``stream``."""
    return f"{base}:mcp:end:{stream}"


# -- replicas of an MCP server: notifications (pub/sub channels on the prefix)


def session_channel(prefix: str, session: str) -> str:
    """Where the replicas watching ``session`` hear of it."""
    return f"{prefix}mcp:s:{session}"


def all_channel(prefix: str) -> str:
    """Where every replica hears what concerns them all."""
    return f"{prefix}mcp:all"


def replica_channel(prefix: str, replica: str) -> str:
    """Where replica ``replica`` hears what is sent to it alone."""
    return f"{prefix}mcp:r:{replica}"


def probe_channel(prefix: str, replica: str) -> str:
    """The channel a replica's start-up check publishes on and subscribes to."""
    return replica_channel(prefix, f"probe.{replica}")


def store_era(prefix: str) -> str:
    """The store's era and its count of ended sessions and tasks: a store gone back shows it."""
    return f"{prefix}{{store}}:era"


def request_state(prefix: str) -> str:
    """The key that seals the ``requestState`` tokens every replica hands out."""
    return f"{prefix}{{request-state}}:key"


def store_marker(prefix: str) -> str:
    """A token replicas read after an outage: missing or changed, the store came back empty."""
    return f"{prefix}{{store}}:marker"


def request_state_used(prefix: str, digest: str) -> str:
    """The mark of a ``requestState`` token already used (its own hash tag: spread on a cluster)."""
    return f"{prefix}{{request-state:{digest}}}:used"


# -- listen events (under a tag of their own)


def listen(key_base: KeyBase) -> tuple[str, str]:
    """The stream of listen events, and the number of the newest one."""
    root = key_base("listen")
    return f"{root}:events", f"{root}:count"


# -- tasks (each task under a tag of its own; ``space``: the namespace as keys spell it)


def task_keys(key_base: KeyBase, space: str, task_id: str) -> list[str]:
    """A task's keys: its hash, its outstanding input requests, the answers not yet taken,
    its retained events (a list; also the channel its appends are announced on)."""
    root = key_base(f"task:{space}:{task_id}" if space else f"task:{task_id}")
    return [f"{root}:task", f"{root}:in", f"{root}:ans", f"{root}:ev"]


def task_event_channels(key_base: KeyBase, space: str) -> tuple[str, str, str]:
    """The pattern matching every task's event channel, and what surrounds a task id in one.

    A channel is the task's event list's own name (:func:`task_keys`), so one
    ``PSUBSCRIBE`` per replica hears the appends of every task of the namespace.
    """
    marker = "\x01"
    head, tail = task_keys(key_base, space, marker)[3].split(marker)
    return f"{_glob(head)}*{_glob(tail)}", head, tail


def _glob(text: str) -> str:
    """``text`` matched literally by a Redis glob pattern."""
    return "".join("\\" + c if c in "*?[]\\" else c for c in text)


def _tasks(key_base: KeyBase, space: str) -> str:
    return key_base(f"tasks:{space}" if space else "tasks")


def task_index(key_base: KeyBase, space: str) -> str:
    """The namespace's running tasks, scored by when their lease may have lapsed."""
    return f"{_tasks(key_base, space)}:running"


def task_nudges(key_base: KeyBase, space: str) -> str:
    """The start of the runners' channels: the runner's id follows."""
    return f"{_tasks(key_base, space)}:nudge:"
