"""Write docs/cli.md from the command line's own parser: ``python scripts/cli_reference.py``.

The page is each command's ``--help`` as the parser prints it at 100 columns, so it can never
say a flag that is not there; tests/test_docs.py checks it still matches.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

WIDTH = "100"
PAGE = Path(__file__).resolve().parents[1] / "docs" / "cli.md"
_HEAD = """# The `alpineagents` command line

Generated from the parser by `python scripts/cli_reference.py`; do not edit by hand. The suite
checks that every block below is what `alpineagents COMMAND --help` prints.

"""


def help_texts() -> dict[str, str]:
    """``--help`` of the command line and of each command, keyed by the command's name."""
    os.environ["COLUMNS"] = WIDTH  # argparse wraps to the terminal's width: make it fixed
    from alpineagents.cli import command_parser

    parser = command_parser()
    texts = {"": parser.format_help()}
    for action in parser._actions:  # argparse keeps its subcommands here, there is no public way
        if isinstance(action, argparse._SubParsersAction):
            for name, command in action.choices.items():
                texts[name] = command.format_help()
    return texts


def page() -> str:
    """The whole of docs/cli.md."""
    parts = [_HEAD]
    for name, text in help_texts().items():
        title = f"alpineagents {name}".strip()
        parts.append(f"## `{title}`\n\n```text\n{text.rstrip()}\n```\n\n")
    return "".join(parts).rstrip() + "\n"


if __name__ == "__main__":
    PAGE.write_text(page(), encoding="utf-8")
    sys.exit(0)
