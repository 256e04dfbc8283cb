"""Resumption verdicts and timings for operators.

A resumption that fails is not an error of the server: it is the store saying
"I cannot prove continuity", which is exactly what an operator wants to count
(a rising ``below_floor`` rate means ``max_events`` is too small; any
``foreign_cursor`` means a proxy or a client mixes sessions). The hook is a
small protocol so that any metrics system can be plugged in;
:class:`PrometheusObserver` is the ready-made one, imported lazily so that
``prometheus_client`` stays optional.
"""

from __future__ import annotations

import threading
from collections import Counter
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

__all__ = [
    "STORAGE_ERROR",
    "CountingObserver",
    "PrometheusObserver",
    "ResumptionObserver",
]

if TYPE_CHECKING:  # pragma: no cover
    from prometheus_client import CollectorRegistry

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
        namespace: str = "replaystore_mcp",
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
        options: dict[str, Any] = {} if registry is None else {"registry": registry}
        self.registry = registry if registry is not None else prometheus_client.REGISTRY
        self.resumptions = prometheus_client.Counter(
            f"{namespace}_resumptions",
            "Resumption attempts (GET with Last-Event-ID, or a plain GET catching up), by verdict.",
            ["verdict"],
            **options,
        )
        self.latency = prometheus_client.Histogram(
            f"{namespace}_replay_seconds",
            "Time of the atomic resolve-and-replay, by outcome (resumed, failed, storage_error).",
            ["outcome"],
            buckets=buckets,
            **options,
        )
        self.replayed = prometheus_client.Counter(
            f"{namespace}_replayed_events",
            "Messages sent again to resuming clients.",
            **options,
        )
        self._children: dict[str, tuple[Any, Any]] = {}

    def on_resumption(self, session: str, verdict: str, seconds: float, replayed: int) -> None:
        children = self._children.get(verdict)
        if children is None:
            # A labelled child is looked up under a lock on every call; a
            # replica observes every resume, so each verdict's pair is kept.
            if verdict == "resumed":
                outcome = "resumed"
            elif verdict == STORAGE_ERROR:
                outcome = STORAGE_ERROR
            else:
                outcome = "failed"
            children = (
                self.resumptions.labels(verdict=verdict),
                self.latency.labels(outcome=outcome),
            )
            self._children[verdict] = children
        counted, timed = children
        counted.inc()
        timed.observe(seconds)
        if replayed:
            self.replayed.inc(replayed)
