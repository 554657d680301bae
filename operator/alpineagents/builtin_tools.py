"""The built-in tools an AgentRun can list in ``spec.tools``: shell, read_file, write_file, fetch_url.

Each is off unless listed. The file tools are confined to one working directory (no
escape through ``..``, absolute paths or symlinks), and every tool has limits on time
and size so one call cannot hang a run or flood the model's context.
"""

from __future__ import annotations

import contextlib
import os
import posixpath
import signal
import stat
import subprocess
import threading
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from .pod_contract import CREDENTIAL_ENV, ENV_MCP_PREFIX
from .tools import Tool

NAMES = ("fetch_url", "read_file", "shell", "write_file")
"""The built-in tool names, sorted."""

SHELL_TIMEOUT = 120.0
"""Seconds a shell command may run when the model gives no timeout."""
SHELL_MAX_TIMEOUT = 1800.0
OUTPUT_LIMIT = 30_000
"""Characters of a command's output (or a fetched page) the model gets; the middle is cut."""
READ_LIMIT = 100_000
"""Bytes ``read_file`` returns in one call; larger files are read in parts with ``offset``."""
WRITE_LIMIT = 1 << 20
"""Bytes ``write_file`` writes in one call."""
FETCH_TIMEOUT = 30.0
FETCH_MAX_BYTES = 1 << 20
"""Bytes of a response body ``fetch_url`` reads; the rest is not downloaded."""


class ToolFailed(Exception):
    """A built-in tool's call did not do what was asked; the message says why, for the model."""


def make_tools(names: Iterable[str], *, workdir: str | os.PathLike[str]) -> list[Tool]:
    """The built-in tools called ``names``, working in ``workdir``.

    Raises ``ValueError`` naming the unknown ones.
    """
    root = Path(os.path.realpath(workdir))
    makers = {
        "shell": _shell_tool,
        "read_file": _read_file_tool,
        "write_file": _write_file_tool,
        "fetch_url": _fetch_url_tool,
    }
    chosen = list(dict.fromkeys(names))
    unknown = [name for name in chosen if name not in makers]
    if unknown:
        raise ValueError(f"unknown tool {unknown[0]!r}; built-in tools are: {', '.join(NAMES)}")
    return [makers[name](root) for name in chosen]


def stop_commands() -> None:
    """Kill the shell commands still running (with their children), e.g. when the run stops.

    A command runs in a process group of its own, so a signal meant for the runner does
    not reach it; without this a stopped run would leave it behind.
    """
    with _running_lock:
        groups = list(_running)
    for pid in groups:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(pid, signal.SIGKILL)


# ---------------------------------------------------------------------------- shell

_running: set[int] = set()
_running_lock = threading.Lock()


def _shell_tool(root: Path) -> Tool:
    def shell(command: str, timeout: float = SHELL_TIMEOUT) -> str:
        return _run_command(root, command, timeout)

    return Tool(
        name="shell",
        description=(
            f"Run a command with /bin/sh in the working directory {root} and return its exit "
            f"code and output (stdout and stderr together, at most {OUTPUT_LIMIT} characters; "
            "the middle of longer output is cut). A command that exits non-zero or runs past "
            "its timeout is an error. No input is given on stdin."
        ),
        input_schema={
            "type": "object",
            "properties": {
                "command": {"type": "string", "description": "The shell command to run"},
                "timeout": {
                    "type": "number",
                    "description": (
                        f"Seconds before the command is killed (default {SHELL_TIMEOUT:g}, "
                        f"at most {SHELL_MAX_TIMEOUT:g})"
                    ),
                },
            },
            "required": ["command"],
        },
        function=shell,
    )


def _run_command(root: Path, command: str, timeout: float) -> str:
    if not isinstance(command, str) or not command.strip():
        raise ToolFailed("command must be a non-empty string")
    limit = min(max(float(timeout), 0.1), SHELL_MAX_TIMEOUT)
    env = {
        k: v
        for k, v in os.environ.items()
        if k not in CREDENTIAL_ENV and not k.startswith(ENV_MCP_PREFIX)
    }
    process = subprocess.Popen(
        ["/bin/sh", "-c", command],
        cwd=root,
        env=env,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        # Its own group: a timeout kills the command's children too.
        process_group=0,
    )
    with _running_lock:
        _running.add(process.pid)
    try:
        try:
            raw, _ = process.communicate(timeout=limit)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(process.pid, signal.SIGKILL)
            raw, _ = process.communicate()
            output = _cut(raw.decode(errors="replace"))
            raise ToolFailed(f"timed out after {limit:g}s and was killed\n{output}") from None
    finally:
        with _running_lock:
            _running.discard(process.pid)
        if process.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(process.pid, signal.SIGKILL)
    output = _cut(raw.decode(errors="replace"))
    if process.returncode != 0:
        raise ToolFailed(f"exit code {process.returncode}\n{output}")
    return f"exit code 0\n{output}"


def _cut(text: str, limit: int = OUTPUT_LIMIT) -> str:
    if len(text) <= limit:
        return text
    half = limit // 2
    return f"{text[:half]}\n… ({len(text) - 2 * half} characters cut) …\n{text[-half:]}"


# ---------------------------------------------------------------------------- files


def _read_file_tool(root: Path) -> Tool:
    def read_file(path: str, offset: int = 0) -> str:
        return _read(root, path, offset)

    return Tool(
        name="read_file",
        description=(
            f"Read a text file inside the working directory {root}. Returns at most "
            f"{READ_LIMIT} bytes from offset; a longer file says which offset to read next."
        ),
        input_schema={
            "type": "object",
            "properties": {
                "path": {
                    "type": "string",
                    "description": "The file's path, relative to the working directory",
                },
                "offset": {
                    "type": "integer",
                    "description": "Byte offset to start reading at (default 0)",
                },
            },
            "required": ["path"],
        },
        function=read_file,
    )


def _write_file_tool(root: Path) -> Tool:
    def write_file(path: str, content: str) -> str:
        return _write(root, path, content)

    return Tool(
        name="write_file",
        description=(
            f"Write a text file inside the working directory {root}, replacing it if it "
            f"exists and creating missing folders. At most {WRITE_LIMIT} bytes."
        ),
        input_schema={
            "type": "object",
            "properties": {
                "path": {
                    "type": "string",
                    "description": "The file's path, relative to the working directory",
                },
                "content": {"type": "string", "description": "The whole new content"},
            },
            "required": ["path", "content"],
        },
        function=write_file,
    )


def _inside(root: Path, path: str) -> Path:
    """``path`` as a location inside ``root``, or ToolFailed if it would lead outside."""
    if not isinstance(path, str) or not path or "\0" in path:
        raise ToolFailed("path must be a non-empty string")
    joined = posixpath.normpath(posixpath.join(str(root), path))
    # realpath follows every symlink, also ones in the middle or at the end.
    real = os.path.realpath(joined)
    if real != str(root) and not real.startswith(str(root) + os.sep):
        raise ToolFailed(f"{path!r} is outside the working directory {root}; use a path inside it")
    return Path(real)


def _read(root: Path, path: str, offset: int) -> str:
    target = _inside(root, path)
    try:
        # O_NOFOLLOW: a symlink swapped in after the check above is refused, not followed.
        fd = os.open(target, os.O_RDONLY | os.O_NOFOLLOW)
    except FileNotFoundError:
        raise ToolFailed(f"{path!r} does not exist") from None
    except OSError as error:
        raise ToolFailed(f"cannot open {path!r}: {error.strerror}") from None
    with os.fdopen(fd, "rb") as file:
        info = os.fstat(file.fileno())
        if stat.S_ISDIR(info.st_mode):
            names = sorted(os.listdir(target))
            raise ToolFailed(f"{path!r} is a folder; it holds: {', '.join(names[:200])}")
        if not stat.S_ISREG(info.st_mode):
            raise ToolFailed(f"{path!r} is not a regular file")
        start = max(0, int(offset))
        file.seek(start)
        data = file.read(READ_LIMIT)
    if b"\0" in data:
        raise ToolFailed(f"{path!r} is a binary file ({info.st_size} bytes)")
    text = data.decode(errors="replace")
    end = start + len(data)
    if end < info.st_size:
        text += (
            f"\n(the file has {info.st_size} bytes; this was bytes {start}-{end}; "
            f"read on with offset={end})"
        )
    return text


def _write(root: Path, path: str, content: str) -> str:
    if not isinstance(content, str):
        raise ToolFailed("content must be a string")
    data = content.encode()
    if len(data) > WRITE_LIMIT:
        raise ToolFailed(
            f"content is {len(data)} bytes; write_file writes at most {WRITE_LIMIT} bytes"
        )
    target = _inside(root, path)
    if target == root:
        raise ToolFailed("path names the working directory itself; give a file name")
    target.parent.mkdir(parents=True, exist_ok=True)
    _inside(root, str(target.parent.relative_to(root)))  # no symlink raced in meanwhile
    try:
        fd = os.open(target, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, 0o644)
    except OSError as error:
        raise ToolFailed(f"cannot write {path!r}: {error.strerror}") from None
    with os.fdopen(fd, "wb") as file:
        file.write(data)
    return f"wrote {len(data)} bytes to {target.relative_to(root)}"


# ---------------------------------------------------------------------------- fetch_url


def _fetch_url_tool(root: Path) -> Tool:
    def fetch_url(url: str, timeout: float = FETCH_TIMEOUT) -> str:
        return _fetch(url, timeout)

    return Tool(
        name="fetch_url",
        description=(
            "Fetch a URL with HTTP GET and return its status and body as text (at most "
            f"{FETCH_MAX_BYTES} bytes are read, {OUTPUT_LIMIT} characters returned). "
            "Only http and https URLs. A status of 400 or more is an error."
        ),
        input_schema={
            "type": "object",
            "properties": {
                "url": {"type": "string", "description": "The http(s) URL to fetch"},
                "timeout": {
                    "type": "number",
                    "description": f"Seconds to wait for the server (default {FETCH_TIMEOUT:g})",
                },
            },
            "required": ["url"],
        },
        function=fetch_url,
    )


def _fetch(url: str, timeout: float) -> str:
    if not isinstance(url, str) or not url.lower().startswith(("http://", "https://")):
        raise ToolFailed(f"{url!r} is not an http or https URL")
    # Imported here: urllib.request pulls in http, email and ssl, which a CLI command
    # that never fetches (list, show) should not wait for.
    import urllib.error
    import urllib.request

    limit = min(max(float(timeout), 0.1), 300.0)
    request = urllib.request.Request(url, headers={"User-Agent": "alpineagents-fetch_url"})
    try:
        with urllib.request.urlopen(request, timeout=limit) as response:
            return _page(response.status, response, url)
    except urllib.error.HTTPError as error:
        with error:
            raise ToolFailed(_page(error.code, error, url)) from None
    except urllib.error.URLError as error:
        raise ToolFailed(f"cannot fetch {url}: {error.reason}") from None
    except TimeoutError:
        raise ToolFailed(f"cannot fetch {url}: no answer within {limit:g}s") from None


def _page(status: int, response: Any, url: str) -> str:
    body: bytes = response.read(FETCH_MAX_BYTES + 1)
    cut = len(body) > FETCH_MAX_BYTES
    charset = response.headers.get_content_charset() or "utf-8"
    try:
        text = body[:FETCH_MAX_BYTES].decode(charset, errors="replace")
    except LookupError:
        text = body[:FETCH_MAX_BYTES].decode("utf-8", errors="replace")
    kind = response.headers.get("content-type", "unknown type")
    note = f" (only the first {FETCH_MAX_BYTES} bytes were read)" if cut else ""
    return f"HTTP {status} {url} ({kind}){note}\n{_cut(text)}"
