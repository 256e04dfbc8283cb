"""What a replica tells its operator: every metric name, and the observers of resumptions.

Two parts:

- **resumptions**: a failed one is not an error of the server: it is the
  store saying "I cannot prove continuity", which is exactly what an
  operator wants to count (a rising ``below_floor`` rate means
  ``max_events`` is too small; any ``foreign_cursor`` means a proxy or a
  client mixes sessions). The hook is a small protocol so that any metrics
  system can be plugged in; :class:`PrometheusObserver` is the ready-made
  one, imported lazily so that ``prometheus_client`` stays optional.
- **the replica's state** (:func:`serve_metrics`, what ``metrics_path=`` of
  the app wiring mounts): 503s by reason, store round trips, leases, tasks,
  sessions and listen streams open, drains. Counted by the few calls below
  (:func:`count_unavailable`, :func:`time_store`, :func:`count_drain`,
  :func:`count_task_end`), each a no-op until an app of the process serves
  metrics; the gauges are read from the apps' state when scraped, so keeping
  them costs a request nothing.

Every name is spelled here once (``docs/deployment.md`` says what to alert on).
"""

from __future__ import annotations

import contextlib
import threading
import weakref
from bisect import bisect_left
from collections import Counter
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from itertools import accumulate
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

__all__ = [
    "DRAINS",
    "LEASES",
    "LISTEN_STREAMS",
    "NAMESPACE",
    "SESSIONS",
    "STORAGE_ERROR",
    "STORE_SECONDS",
    "TASKS",
    "TASK_ENDS",
    "UNAVAILABLE",
    "CountingObserver",
    "Held",
    "Holder",
    "PrometheusObserver",
    "ResumptionObserver",
    "count_drain",
    "count_task_end",
    "count_unavailable",
    "serve_metrics",
    "time_store",
    "watch",
]

if TYPE_CHECKING:  # pragma: no cover
    from prometheus_client import CollectorRegistry
    from prometheus_client.metrics_core import Metric
    from starlette.applications import Starlette

#: The start of every metric name.
NAMESPACE = "replaystore_mcp"
#: Counter: requests answered 503, by ``reason`` (``draining``, ``session_dropped``,
#: ``store_unreachable``, ``store_oom``, ``store_readonly``, ``store_noperm``,
#: ``store_unreplicated`` ...: ``store_`` and the store's error kind).
UNAVAILABLE = f"{NAMESPACE}_unavailable"
#: Histogram: seconds of one store round trip, by ``operation`` (``append``,
#: ``resume``, ``health``), failed ones included.
STORE_SECONDS = f"{NAMESPACE}_store_seconds"
#: Gauge: leases this replica holds, by ``kind`` (``request``, ``task``).
LEASES = f"{NAMESPACE}_leases_held"
#: Gauge: tasks running on this replica, by ``state`` (``working``, ``input_required``).
TASKS = f"{NAMESPACE}_tasks"
#: Counter: tasks this replica ran to their end, by ``status`` (``completed``, ``failed``).
TASK_ENDS = f"{NAMESPACE}_task_ends"
#: Gauge: sessions this replica serves (its copies; every session lives in the store).
SESSIONS = f"{NAMESPACE}_sessions_open"
#: Gauge: ``subscriptions/listen`` streams open on this replica.
LISTEN_STREAMS = f"{NAMESPACE}_listen_streams_open"
#: Counter: drains, by ``stage``: ``started``; at their end ``finished`` (every
#: running request done in time) or ``handed_over`` (requests still running were
#: handed to other replicas), and ``handed_over`` again when tasks still running were.
DRAINS = f"{NAMESPACE}_drains"

#: The "verdict" reported when the store could not be reached (HTTP 503):
#: nothing is known about the real verdict, so it is counted apart.
STORAGE_ERROR = "storage_error"


@runtime_checkable
class ResumptionObserver(Protocol):
    """Called once per resumption attempt, after the verdict is known.

    ``verdict`` is a :class:`~replaystore.Verdict` value (``"resumed"``,
    ``"below_floor"`` …) or :data:`STORAGE_ERROR`; ``seconds`` is the time the
    atomic resolve-and-replay took; ``replayed`` the number of messages
    replayed (0 unless resumed). Runs on the request path: keep it cheap and
    never raise.
    """

    def on_resumption(self, session: str, verdict: str, seconds: float, replayed: int) -> None: ...


class CountingObserver:
    """In-process: a counter per verdict and the list of latencies (tests, debugging)."""

    def __init__(self) -> None:
        self.verdicts: Counter[str] = Counter()
        self.seconds: list[float] = []
        self.replayed = 0
        self._lock = threading.Lock()

    def on_resumption(self, session: str, verdict: str, seconds: float, replayed: int) -> None:
        with self._lock:
            self.verdicts[verdict] += 1
            self.seconds.append(seconds)
            self.replayed += replayed


class PrometheusObserver:
    """Prometheus metrics: ``<ns>_resumptions_total{verdict}``, ``<ns>_replay_seconds{outcome}``
    and ``<ns>_replayed_events_total``.

    ``registry`` defaults to ``prometheus_client.REGISTRY``; pass your own
    ``CollectorRegistry`` to build more than one observer in a process.
    """

    def __init__(
        self,
        registry: CollectorRegistry | None = None,
        *,
        namespace: str = NAMESPACE,
        buckets: tuple[float, ...] = (
            0.0005,
            0.001,
            0.0025,
            0.005,
            0.01,
            0.025,
            0.05,
            0.1,
            0.25,
            0.5,
            1.0,
            2.5,
        ),
    ) -> None:
        try:
            import prometheus_client
        except ImportError as exc:  # pragma: no cover - depends on the environment
            raise ImportError(
                "PrometheusObserver needs prometheus_client: pip install 'replaystore[prometheus]'"
            ) from exc
        self.registry = registry if registry is not None else prometheus_client.REGISTRY
        # One lock for the three: a resumption updates them together, under it once.
        self._lock = threading.Lock()
        self.resumptions = _Counts(
            f"{namespace}_resumptions",
            "Resumption attempts (GET with Last-Event-ID, or a plain GET catching up), by verdict.",
            "verdict",
            lock=self._lock,
        )
        self.latency = _Timings(
            f"{namespace}_replay_seconds",
            "Time of the atomic resolve-and-replay, by outcome (resumed, failed, storage_error).",
            "outcome",
            buckets,
            lock=self._lock,
        )
        self.replayed = _Counts(
            f"{namespace}_replayed_events",
            "Messages sent again to resuming clients.",
            lock=self._lock,
        )
        self.registry.register(_Collector(self.resumptions, self.latency, self.replayed))

    def on_resumption(self, session: str, verdict: str, seconds: float, replayed: int) -> None:
        outcome = verdict if verdict in _OWN_OUTCOMES else "failed"
        with self._lock:
            self.resumptions.add_held(verdict)
            self.latency.observe_held(outcome, seconds)
            if replayed:
                self.replayed.add_held("", replayed)


_OWN_OUTCOMES = frozenset({"resumed", STORAGE_ERROR})


class _Counts:
    """A counter by one label (or none), kept as plain numbers and written out when scraped.

    prometheus_client's own instruments look a labelled child up, and take a
    lock per value, on every call: a histogram's observation runs a dozen
    Python calls. A replica counts every resume, so the instruments it
    counts them with keep a number per label value under one lock instead,
    and a collector writes them out as metric families at each scrape.
    """

    def __init__(
        self,
        name: str,
        documentation: str,
        label: str | None = None,
        *,
        lock: threading.Lock | None = None,
    ) -> None:
        self.name, self.documentation, self.label = name, documentation, label
        self.values: dict[str, float] = {}
        self._lock = lock if lock is not None else threading.Lock()

    def add(self, label: str, amount: float = 1) -> None:
        with self._lock:
            self.add_held(label, amount)

    def add_held(self, label: str, amount: float = 1) -> None:
        """:meth:`add`, by a caller holding the lock (given to several instruments at once)."""
        self.values[label] = self.values.get(label, 0) + amount

    def family(self) -> Metric:
        from prometheus_client.core import CounterMetricFamily

        labels = [] if self.label is None else [self.label]
        family = CounterMetricFamily(self.name, self.documentation, labels=labels)
        with self._lock:
            values = sorted(self.values.items())
        if self.label is None:  # one value, under the label ""
            family.add_metric([], dict(values).get("", 0))
        else:
            for label, value in values:
                family.add_metric([label], value)
        return family


class _Timings:
    """A histogram of seconds by one label, kept as :class:`_Counts` keeps a counter."""

    def __init__(
        self,
        name: str,
        documentation: str,
        label: str,
        buckets: tuple[float, ...],
        *,
        lock: threading.Lock | None = None,
    ) -> None:
        self.name, self.documentation, self.label = name, documentation, label
        self.bounds = sorted(buckets)
        #: Per label value: the count of each bucket (the last one +Inf), then the sum.
        self.rows: dict[str, list[float]] = {}
        self._lock = lock if lock is not None else threading.Lock()

    def observe(self, label: str, seconds: float) -> None:
        with self._lock:
            self.observe_held(label, seconds)

    def observe_held(self, label: str, seconds: float) -> None:
        """:meth:`observe`, by a caller holding the lock (given to several instruments at once)."""
        row = self.rows.get(label)
        if row is None:
            row = self.rows[label] = [0] * (len(self.bounds) + 2)
        row[bisect_left(self.bounds, seconds)] += 1  # the first bound at or above it
        row[-1] += seconds

    def family(self) -> Metric:
        from prometheus_client.core import HistogramMetricFamily
        from prometheus_client.utils import floatToGoString

        family = HistogramMetricFamily(self.name, self.documentation, labels=[self.label])
        names = [*map(floatToGoString, self.bounds), "+Inf"]
        with self._lock:
            rows = sorted((label, list(row)) for label, row in self.rows.items())
        for label, row in rows:
            family.add_metric([label], list(zip(names, accumulate(row[:-1]), strict=True)), row[-1])
        return family


class _Collector:
    """What Prometheus reads of :class:`_Counts` and :class:`_Timings` at each scrape."""

    def __init__(self, *instruments: _Counts | _Timings) -> None:
        self._instruments = instruments

    def describe(self) -> list[Metric]:
        return [each.family() for each in self._instruments]  # names, checked when registered

    def collect(self) -> Iterator[Metric]:
        for each in self._instruments:
            yield each.family()


# ---------------------------------------------------------------- the replica's state


class _Instruments:
    """The process' counters and histogram, and the collector of its gauges, in one registry."""

    def __init__(self, registry: CollectorRegistry) -> None:
        import prometheus_client

        self.registry = registry
        self.observer: PrometheusObserver | None = None
        # (ValueError: the application's own PrometheusObserver() counts there already.)
        with contextlib.suppress(ValueError):
            self.observer = PrometheusObserver(registry)
        self.unavailable = prometheus_client.Counter(
            UNAVAILABLE, "Requests answered 503, by reason.", ["reason"], registry=registry
        )
        self.store_seconds = _Timings(
            STORE_SECONDS,
            "Seconds of one store round trip, by operation (failed ones included).",
            "operation",
            (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5),
        )
        registry.register(_Collector(self.store_seconds))
        self.drains = prometheus_client.Counter(
            DRAINS, "Drains of this replica, by stage.", ["stage"], registry=registry
        )
        self.task_ends = prometheus_client.Counter(
            TASK_ENDS,
            "Tasks this replica ran to their end, by status.",
            ["status"],
            registry=registry,
        )
        registry.register(_Gauges())


@dataclass
class Held:
    """What one app holds at a scrape: the gauges add these up over every app of the process."""

    sessions: int = 0
    request_leases: int = 0
    #: One state per task running here (``working``, ``input_required``).
    task_states: list[str] = field(default_factory=list)
    listening: int = 0


class Holder(Protocol):
    """An app, as the gauges read it (the wiring's state of each app)."""

    def held(self) -> Held:
        """What the app holds now."""
        ...


_lock = threading.Lock()
_instruments: _Instruments | None = None
#: What every app of the process holds (its sessions, leases, tasks, listen streams).
_apps: weakref.WeakSet[Holder] = weakref.WeakSet()


def instruments() -> _Instruments:
    """The process' instruments, registered once in ``prometheus_client.REGISTRY``."""
    global _instruments
    with _lock:
        if _instruments is None:
            try:
                import prometheus_client
            except ImportError as exc:  # pragma: no cover - depends on the environment
                raise ImportError(
                    "metrics need prometheus_client: pip install 'replaystore[prometheus]'"
                ) from exc
            _instruments = _Instruments(prometheus_client.REGISTRY)
        return _instruments


def watch(app: Holder) -> None:
    """Count what an app holds in the gauges (kept as long as the app lives)."""
    _apps.add(app)


def unavailable_reason(data: Mapping[str, Any] | None) -> str:
    """The ``reason`` label of a 503, from its JSON-RPC error's ``data``."""
    if not data:
        return "store_unreachable"
    if data.get("draining"):
        return "draining"
    reason = str(data.get("reason", "storage_error"))
    if reason == STORAGE_ERROR:
        return f"store_{data.get('store', 'unreachable')}"
    return reason


def count_unavailable(data: Mapping[str, Any] | None) -> None:
    """A request was answered 503 with this ``data``."""
    if _instruments is not None:
        _instruments.unavailable.labels(reason=unavailable_reason(data)).inc()


def time_store(operation: str, seconds: float) -> None:
    """One store round trip of ``operation`` took ``seconds``."""
    if _instruments is not None:
        _instruments.store_seconds.observe(operation, seconds)


def count_drain(stage: str) -> None:
    """A drain reached ``stage`` (``started``, ``finished``, ``handed_over``)."""
    if _instruments is not None:
        _instruments.drains.labels(stage=stage).inc()


def count_task_end(status: str) -> None:
    """A task run here ended with ``status``, stored."""
    if _instruments is not None:
        _instruments.task_ends.labels(status=status).inc()


class _Gauges:
    """The gauges, read from every app's state at each scrape."""

    def describe(self) -> list[Metric]:
        return []  # read at each scrape: nothing to check when registered

    def collect(self) -> Iterator[Metric]:
        from prometheus_client.core import GaugeMetricFamily

        sessions = request_leases = task_leases = listening = 0
        states: Counter[str] = Counter({"working": 0, "input_required": 0})
        for app in list(_apps):
            held = app.held()
            sessions += held.sessions
            request_leases += held.request_leases
            states.update(held.task_states)
            task_leases += len(held.task_states)
            listening += held.listening
        yield GaugeMetricFamily(SESSIONS, "Sessions this replica serves.", value=sessions)
        leases = GaugeMetricFamily(LEASES, "Leases this replica holds, by kind.", labels=["kind"])
        leases.add_metric(["request"], request_leases)
        leases.add_metric(["task"], task_leases)
        yield leases
        tasks = GaugeMetricFamily(
            TASKS, "Tasks running on this replica, by state.", labels=["state"]
        )
        for state, count in sorted(states.items()):
            tasks.add_metric([state], count)
        yield tasks
        yield GaugeMetricFamily(
            LISTEN_STREAMS, "subscriptions/listen streams open on this replica.", value=listening
        )


def serve_metrics(app: Starlette, path: str) -> PrometheusObserver | None:
    """Answer ``GET path`` with every metric of ``prometheus_client.REGISTRY`` (yours too).

    Returns the process' resumption observer, for a store that has none (None
    when the application registered one of its own there).
    """
    from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
    from starlette.requests import Request
    from starlette.responses import Response
    from starlette.routing import Route

    found = instruments()

    async def metrics(request: Request) -> Response:
        return Response(generate_latest(found.registry), media_type=CONTENT_TYPE_LATEST)

    app.router.routes.append(Route(path, metrics, methods=["GET"]))
    return found.observer
