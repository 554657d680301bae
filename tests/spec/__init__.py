"""The code examples of the spec page, copied verbatim (test_spec_examples.py checks the copy)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

EXAMPLES = Path(__file__).parent


def memory_store_class() -> Any:
    """The spec's MemoryStore class, without running the rest of its example."""
    source = (EXAMPLES / "memory_store_example.py").read_text()
    namespace: dict[str, Any] = {"__name__": "spec_memory_store"}
    exec(
        compile(source.split("\n\nstore = MemoryStore()")[0], "memory_store_example.py", "exec"),
        namespace,
    )
    return namespace["MemoryStore"]
