"""The code examples of the spec page (docs/survive-crashes-and-restarts.md), copied
verbatim; tests/runtime/test_spec_examples.py checks the copy and runs them."""
