"""On xdist workers, the test modules that take longest are dealt out first.

``./scripts/test`` runs each module whole on one of two workers (``--dist
loadscope``, so a module's servers start once) and deals modules out in
collection order (``--no-loadscope-reorder``; xdist would otherwise deal the
modules with most tests first, which are the quick parametrized ones). A long
module dealt out last runs alone at the end while the other worker idles;
dealt out first, the short ones fill in beside it.

The figures are rough seconds per module, summed from ``--durations`` of runs
on two workers: only their order matters, so they need no precision, and a
module missing here is dealt out after these in its collection order.
"""

from __future__ import annotations

import pytest

#: Rough seconds per module on two workers (two cores), longest first.
LONG_MODULES: dict[str, int] = {
    "tests/bench/test_bench_storm.py": 180,
    "tests/mcp/test_balancers.py": 150,
    "tests/mcp/tasks/test_task_drain.py": 70,
    "tests/mcp/tasks/test_task_outages.py": 60,
    "tests/mcp/fastmcp/test_tasks_fastmcp.py": 60,
    "tests/mcp/tasks/test_tasks.py": 50,
    "tests/mcp/replicas/test_replicas.py": 40,
    "tests/mcp/tasks/test_task_event_streams.py": 40,
    "tests/mcp/test_user_app_drain.py": 30,
    "tests/benchmarks/test_tasks_benchmark_smoke.py": 25,
    "tests/mcp/sessions/test_races.py": 25,
}


def _module(item: pytest.Item) -> str:
    return item.nodeid.split("::", 1)[0]


@pytest.hookimpl(trylast=True)
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Longest modules first, on xdist workers only (a stable sort: the rest keep their order).

    In one process the order stays the servers plugin's: quick tests report first.
    """
    if hasattr(config, "workerinput"):
        items.sort(key=lambda item: -LONG_MODULES.get(_module(item), 0))
