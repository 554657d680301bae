from typing import Any

import pytest

# The test bench's fixtures, one module per real component (see tests/bench/).
pytest_plugins: list[str] = [
    "tests.bench.minio_server",
    "tests.bench.seaweedfs_server",
    "tests.bench.control_plane",
    "tests.bench.kueue_controller",
    "tests.bench.real_node",
    "tests.bench.tool_gate",
    "tests.bench.model",
    "tests.bench.mcp_server",
    "tests.bench.runner_process",
    "tests.bench.helm",
    "tests.bench.stores",
    "tests.bench.browser",
    "tests.bench.small_fs",
    "tests.bench.otel_collector",
]


# The tests that take the machine's real node or kind's clusters run one after another in
# one worker (scripts/test runs two); every other module runs whole in the other worker,
# its fixtures set up once. The credentials' clock module joins the node's line, whose
# tests are the longest: its first test starts the clock, its last waits for it.
_WITH_THE_NODE = (
    "tests/e2e/",
    "tests/kind/",
    "tests/bench/",
    "tests/operator/test_run_credentials.py",
)


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_make_scheduler(config: pytest.Config, log: Any) -> Any:
    """pytest-xdist's scheduling by scope, the scope being the node's line or a module.

    (Not its ``loadgroup``: under pytest 9.2 the group markers no longer reach the
    tests' ids, so every test went its own way and both workers started a real node.)
    """
    from xdist.scheduler import LoadScopeScheduling

    class _ByLine(LoadScopeScheduling):
        def _split_scope(self, nodeid: str) -> str:
            module = nodeid.split("::", 1)[0]
            return "the real node" if module.startswith(_WITH_THE_NODE) else module

    return _ByLine(config, log)


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    # A test that waits for a server's clock (STS credentials live 15 minutes at the
    # least) runs last, and the test that starts that clock runs first, so the wait
    # overlaps the rest of the suite instead of adding to it.
    def place(item: pytest.Item) -> int:
        marker = item.get_closest_marker("clock")
        return {"start": 0, "end": 2}[marker.args[0]] if marker else 1

    items.sort(key=place)
