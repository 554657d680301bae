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
import threading
import weakref
from collections.abc import Iterable, Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path
from typing import Any, TextIO, cast

from .pod_contract import (
    CREDENTIAL_ENV,
    ENV_ENCRYPTION_KEYS,
    ENV_MCP_PREFIX,
    ENV_PROVIDER_PREFIX,
    ENV_SECRET_NAMES,
)

__all__ = ["MASK", "Redactor", "learn"]

MASK = "***"

_MIN_LENGTH = 8  # shorter values ("true", "1", "us-east-1") would mask ordinary words

_SECRET_NAME = re.compile(r"SECRET|TOKEN|PASSWORD|PASSWD|API_?KEY|PRIVATE_KEY|CREDENTIAL", re.I)


class Redactor:
    """Masks each of ``secrets`` in every form it takes in text: the value, the value
    without surrounding whitespace (``--from-file`` Secrets end in a newline the model
    leaves out), each line of a multi-line value, and the token of an
    ``Authorization``-style value (``Bearer <token>``). Forms shorter than 8 characters
    are kept: they would mask ordinary words.

    :meth:`add` (or :func:`learn`, for every Redactor of the process) masks a value the
    process got later; a Redactor :meth:`from_environment` also reads its ``*_FILE``
    secrets again when a file changes (renewed credentials).
    """

    def __init__(self, secrets: Iterable[str]) -> None:
        self._lock = threading.Lock()
        self._values: set[str] = set()
        self._pattern: re.Pattern[str] | None = None
        self._files: dict[Path, tuple[int, int, int] | None] = {}
        self._add_all(secrets)

    @classmethod
    def from_environment(cls, env: Mapping[str, str] | None = None) -> Redactor:
        """The secrets of a run's environment: the variables named in
        ``ALPINEAGENTS_SECRET_ENV``, the model and store credentials (also from their
        ``*_FILE``), the encryption keys, MCP servers' values from Secrets
        (``ALPINEAGENTS_MCP_*``) and the model provider's (``ALPINEAGENTS_PROVIDER_*``),
        and any variable whose name says it is a secret (``*TOKEN*``, ``*SECRET*``,
        ``*PASSWORD*``, ``*API_KEY*``, ...)."""
        env = os.environ if env is None else env
        named = {n.strip() for n in env.get(ENV_SECRET_NAMES, "").split(",") if n.strip()}
        values: list[str] = []
        files: list[str] = []
        for name, value in env.items():
            if name == ENV_SECRET_NAMES:
                continue
            if (
                name in named
                or name in CREDENTIAL_ENV
                or name.startswith(ENV_MCP_PREFIX)
                or name.startswith(ENV_PROVIDER_PREFIX)
                or _SECRET_NAME.search(name)
            ):
                if name.endswith("_FILE"):
                    files.append(value)
                else:
                    values.append(value)
        files += [env[name + "_FILE"] for name in CREDENTIAL_ENV if env.get(name + "_FILE")]
        # A keyring is "id:key,id:key": each key is a secret of its own too.
        for item in re.split(r"[\s,]+", env.get(ENV_ENCRYPTION_KEYS, "")):
            values.append(item.partition(":")[2])
        redactor = cls(values)
        redactor._files = {Path(path): None for path in files if path}
        redactor._read_changed_files()
        _LEARNING.add(redactor)
        with _LEARNED_LOCK:
            redactor._add_all(_LEARNED)
        return redactor

    def add(self, value: str) -> None:
        """Mask ``value`` (in each of its forms) from now on: a secret the process got
        after this Redactor was made, such as renewed credentials."""
        self._add_all([value])

    def __bool__(self) -> bool:
        self._read_changed_files()
        return self._pattern is not None

    def text(self, text: str) -> str:
        """``text`` with every secret replaced by ``***``."""
        self._read_changed_files()
        return self._text(text)

    def data(self, value: Any) -> Any:
        """A copy of JSON-like ``value`` (dicts, lists, strings) with secrets masked."""
        self._read_changed_files()
        return self._data(value)

    def exception(self, error: BaseException) -> BaseException:
        """Mask secrets in ``error`` in place (its args, ``message`` and ``body``); returns it."""
        self._read_changed_files()
        if self._pattern is None:
            return error
        error.args = tuple(self._data(arg) for arg in error.args)
        for attribute in ("message", "body"):
            if isinstance(getattr(error, attribute, None), str | dict | list):
                setattr(error, attribute, self._data(getattr(error, attribute)))
        notes = getattr(error, "__notes__", None)
        if isinstance(notes, list):
            notes[:] = [self._text(n) for n in notes]
        return error

    def stream(self, stream: TextIO) -> TextIO:
        """A stream that masks secrets in what is written to ``stream``, line by line."""
        return cast(TextIO, _RedactingStream(stream, self))

    @contextmanager
    def guarding_stdio(self) -> Iterator[None]:
        """For the length of the block, everything printed to stdout and stderr (progress
        lines, warnings, tracebacks) passes through :meth:`stream`."""
        import sys

        out, err = sys.stdout, sys.stderr
        sys.stdout, sys.stderr = self.stream(out), self.stream(err)
        try:
            yield
        finally:
            sys.stdout.flush()
            sys.stderr.flush()
            sys.stdout, sys.stderr = out, err

    def _text(self, text: str) -> str:
        pattern = self._pattern
        if pattern is None or not text:
            return text
        return pattern.sub(MASK, text)

    def _data(self, value: Any) -> Any:
        if self._pattern is None:
            return value
        if isinstance(value, str):
            return self._text(value)
        if isinstance(value, dict):
            return {
                self._text(k) if isinstance(k, str) else k: self._data(v) for k, v in value.items()
            }
        if isinstance(value, list | tuple):
            return type(value)(self._data(v) for v in value)
        return value

    def _add_all(self, secrets: Iterable[str]) -> None:
        forms = {form for s in secrets if isinstance(s, str) for form in _forms(s)}
        with self._lock:
            if forms <= self._values:
                return
            self._values |= forms
            # Longest first, so a secret that contains another is masked whole.
            ordered = sorted(self._values, key=len, reverse=True)
            self._pattern = re.compile("|".join(map(re.escape, ordered)))

    def _read_changed_files(self) -> None:
        # A few stats per call: cheap next to the writes the masked text is for.
        for path, seen in list(self._files.items()):
            try:
                info = path.stat()
            except OSError:
                continue
            stamp = (info.st_ino, info.st_mtime_ns, info.st_size)
            if stamp != seen:
                self._files[path] = stamp
                self._add_all(_file_secrets(str(path)))


def learn(value: str) -> None:
    """Mask ``value`` in every Redactor made :meth:`~Redactor.from_environment` in this
    process, now and later: for code that reads a secret while the run goes on (renewed
    store credentials)."""
    with _LEARNED_LOCK:
        _LEARNED.add(value)
    for redactor in list(_LEARNING):
        redactor.add(value)


_LEARNING: weakref.WeakSet[Redactor] = weakref.WeakSet()
_LEARNED: set[str] = set()
_LEARNED_LOCK = threading.Lock()
_AUTH_SCHEME = re.compile(r"\b(?:Bearer|Basic|Token)\s+(\S+)", re.I)


def _forms(secret: str) -> set[str]:
    """The ways ``secret`` may appear in text, each long enough to mask safely."""
    forms = {secret, secret.strip()}
    forms.update(line.strip() for line in secret.splitlines())
    forms.update(match.group(1) for match in _AUTH_SCHEME.finditer(secret))
    # The stripped forms are masked, not the whitespace around them: "key\n" keeps its "\n".
    return {form for form in forms if len(form) >= _MIN_LENGTH and form == form.strip()}


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
