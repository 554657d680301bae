# The test bench's fixtures, one module per real component (see tests/bench/).
pytest_plugins: list[str] = [
    "tests.bench.minio_server",
    "tests.bench.seaweedfs_server",
    "tests.bench.control_plane",
    "tests.bench.pod_runner",
    "tests.bench.model",
    "tests.bench.mcp_server",
    "tests.bench.runner_process",
    "tests.bench.helm",
    "tests.bench.stores",
    "tests.bench.small_fs",
]
