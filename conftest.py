# The test bench's fixtures, one module per real component (see tests/bench/).
pytest_plugins: list[str] = []
