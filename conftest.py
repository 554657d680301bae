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
# one worker (scripts/test runs two: pytest-xdist's loadgroup); every other module runs
# whole in the other worker, its fixtures set up once.
_ONE_WORKER = ("tests/e2e/", "tests/kind/", "tests/bench/")


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    # A test that waits for a server's clock (STS credentials live 15 minutes at the
    # least) runs last, and the test that starts that clock runs first, so the wait
    # overlaps the rest of the suite instead of adding to it (both join the real node's
    # worker, whose tests are the longest line).
    def place(item: pytest.Item) -> int:
        marker = item.get_closest_marker("clock")
        return {"start": 0, "end": 2}[marker.args[0]] if marker else 1

    items.sort(key=place)
    for item in items:
        module = item.nodeid.split("::")[0]
        alone = module.startswith(_ONE_WORKER) or item.get_closest_marker("clock")
        item.add_marker(pytest.mark.xdist_group("real-node" if alone else module))
