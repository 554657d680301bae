"""Keeping secret values out of what a run writes down: logs, history, reports.

A :class:`Redactor` knows a set of secret values (the model API key, the store's keys,
the AgentRun's Secret-backed variables) and replaces each of them with ``***`` wherever
it would be written: in text, in JSON-like data, in an exception's message and body, and
in everything written to a stream. The runner puts one in front of every way out of a
run pod (its stdout and stderr, the saved history, the termination message), and the
model client scrubs its own key from the errors it raises (some gateways echo request
headers back in error bodies).

This keeps secrets from landing in logs and records by accident. It is no barrier to an
agent that means to leak one: a shell tool can print a key base64-encoded, or send it
over the network. Confining what the pod holds (per-run store credentials, see
``docs/security.md``) is what limits that.
"""

from __future__ import annotations

import io
import os
import re
from collections.abc import Iterable, Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path
from typing import Any, TextIO, cast

from .pod_contract import ENV_ENCRYPTION_KEYS, ENV_MCP_PREFIX, ENV_SECRET_NAMES

__all__ = ["MASK", "Redactor"]

MASK = "***"

_MIN_LENGTH = 8  # shorter values ("true", "1", "us-east-1") would mask ordinary words
_KNOWN = (
    "ANTHROPIC_API_KEY",
    "ANTHROPIC_AUTH_TOKEN",
    "AWS_ACCESS_KEY_ID",
    "AWS_SECRET_ACCESS_KEY",
    "AWS_SESSION_TOKEN",
    "MINIO_ACCESS_KEY",
    "MINIO_SECRET_KEY",
    ENV_ENCRYPTION_KEYS,
)
_SECRET_NAME = re.compile(r"SECRET|TOKEN|PASSWORD|PASSWD|API_?KEY|PRIVATE_KEY|CREDENTIAL", re.I)


class Redactor:
    """Masks each of ``secrets`` (values of at least 8 characters; shorter ones are kept)."""

    def __init__(self, secrets: Iterable[str]) -> None:
        values = {s for s in secrets if isinstance(s, str) and len(s) >= _MIN_LENGTH}
        # Longest first, so a secret that contains another is masked whole.
        ordered = sorted(values, key=len, reverse=True)
        self._pattern = re.compile("|".join(map(re.escape, ordered))) if ordered else None

    @classmethod
    def from_environment(cls, env: Mapping[str, str] | None = None) -> Redactor:
        """The secrets of a run's environment: the variables named in
        ``ALPINEAGENTS_SECRET_ENV``, the model and store credentials (also from their
        ``*_FILE``), the encryption keys, MCP servers' values from Secrets
        (``ALPINEAGENTS_MCP_*``), and any variable whose name says it is a
        secret (``*TOKEN*``, ``*SECRET*``, ``*PASSWORD*``, ``*API_KEY*``, ...)."""
        env = os.environ if env is None else env
        named = {n.strip() for n in env.get(ENV_SECRET_NAMES, "").split(",") if n.strip()}
        values: list[str] = []
        for name, value in env.items():
            if name == ENV_SECRET_NAMES:
                continue
            if (
                name in named
                or name in _KNOWN
                or name.startswith(ENV_MCP_PREFIX)
                or _SECRET_NAME.search(name)
            ):
                if name.endswith("_FILE"):
                    values += _file_secrets(value)
                else:
                    values.append(value)
        for name in _KNOWN:
            values += _file_secrets(env.get(name + "_FILE"))
        # A keyring is "id:key,id:key": each key is a secret of its own too.
        for item in re.split(r"[\s,]+", env.get(ENV_ENCRYPTION_KEYS, "")):
            values.append(item.partition(":")[2])
        return cls(values)

    def __bool__(self) -> bool:
        return self._pattern is not None

    def text(self, text: str) -> str:
        """``text`` with every secret replaced by ``***``."""
        if self._pattern is None or not text:
            return text
        return self._pattern.sub(MASK, text)

    def data(self, value: Any) -> Any:
        """A copy of JSON-like ``value`` (dicts, lists, strings) with secrets masked."""
        if self._pattern is None:
            return value
        if isinstance(value, str):
            return self.text(value)
        if isinstance(value, dict):
            return {
                self.text(k) if isinstance(k, str) else k: self.data(v) for k, v in value.items()
            }
        if isinstance(value, list | tuple):
            return type(value)(self.data(v) for v in value)
        return value

    def exception(self, error: BaseException) -> BaseException:
        """Mask secrets in ``error`` in place (its args, ``message`` and ``body``); returns it."""
        if self._pattern is None:
            return error
        error.args = tuple(self.data(arg) for arg in error.args)
        for attribute in ("message", "body"):
            if isinstance(getattr(error, attribute, None), str | dict | list):
                setattr(error, attribute, self.data(getattr(error, attribute)))
        notes = getattr(error, "__notes__", None)
        if isinstance(notes, list):
            notes[:] = [self.text(n) for n in notes]
        return error

    def stream(self, stream: TextIO) -> TextIO:
        """A stream that masks secrets in what is written to ``stream``, line by line."""
        return cast(TextIO, _RedactingStream(stream, self))

    @contextmanager
    def guarding_stdio(self) -> Iterator[None]:
        """For the length of the block, everything printed to stdout and stderr (progress
        lines, warnings, tracebacks) passes through :meth:`stream`."""
        import sys

        if self._pattern is None:
            yield
            return
        out, err = sys.stdout, sys.stderr
        sys.stdout, sys.stderr = self.stream(out), self.stream(err)
        try:
            yield
        finally:
            sys.stdout.flush()
            sys.stderr.flush()
            sys.stdout, sys.stderr = out, err


class _RedactingStream(io.TextIOBase):
    """Buffers a line at a time, so a secret written in two pieces is still masked."""

    def __init__(self, target: TextIO, redactor: Redactor) -> None:
        super().__init__()
        self._target = target
        self._redactor = redactor
        self._pending = ""

    def write(self, text: str) -> int:
        self._pending += text
        if "\n" in self._pending:
            complete, _, self._pending = self._pending.rpartition("\n")
            self._target.write(self._redactor.text(complete + "\n"))
            self._target.flush()
        return len(text)

    def flush(self) -> None:
        if self._pending:
            self._target.write(self._redactor.text(self._pending))
            self._pending = ""
        self._target.flush()

    def fileno(self) -> int:
        return self._target.fileno()

    def isatty(self) -> bool:
        return self._target.isatty()

    @property
    def encoding(self) -> str:  # type: ignore[override]
        return str(getattr(self._target, "encoding", "utf-8"))

    def writable(self) -> bool:
        return True


def _file_secrets(path: str | None) -> list[str]:
    if not path:
        return []
    try:
        return [Path(path).read_text().strip()]
    except (OSError, UnicodeDecodeError):
        return []
