"""A server process started by a test-bench fixture: started, awaited, stopped by pid.

Each server runs in its own session (process group) so that stopping it also stops
anything it forked, and its output goes to a log file whose tail is shown when it fails
to come up.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path


class ServerFailed(RuntimeError):
    """A server exited, or did not become ready before its deadline."""


class ServerProcess:
    """One long-running server binary with its command line and log file.

    ``start()`` may be called again after ``stop()``: the same command line (same ports,
    same data directory) is run again, which is how fixtures restart a server.
    """

    def __init__(
        self,
        name: str,
        args: Sequence[str],
        log_path: Path,
        env: Mapping[str, str] | None = None,
        cwd: Path | None = None,
        stop_grace: float = 15.0,
    ) -> None:
        self.name = name
        self.args = [str(arg) for arg in args]
        self.log_path = log_path
        self.env = dict(env) if env is not None else None
        self.cwd = cwd
        self.stop_grace = stop_grace
        """Seconds :meth:`stop` waits after SIGTERM before SIGKILL."""
        self._process: subprocess.Popen[bytes] | None = None

    @property
    def pid(self) -> int | None:
        """The running process's id, or None when it is not running."""
        process = self._process
        return process.pid if process is not None and process.poll() is None else None

    @property
    def running(self) -> bool:
        """Whether the process was started and has not exited."""
        return self._process is not None and self._process.poll() is None

    def start(self) -> None:
        """Start the process (a no-op when it is already running)."""
        if self.running:
            return
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        with self.log_path.open("ab") as log:
            log.write(f"\n=== starting {' '.join(self.args)}\n".encode())
            log.flush()
            self._process = subprocess.Popen(
                self.args,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                env=self.env,
                cwd=self.cwd,
                start_new_session=True,
            )

    def stop(self) -> None:
        """Stop the process: SIGTERM to its process group, SIGKILL if it lingers."""
        process = self._process
        if process is None:
            return
        if process.poll() is None:
            self._signal_group(process.pid, signal.SIGTERM)
            try:
                process.wait(timeout=self.stop_grace)
            except subprocess.TimeoutExpired:
                self._signal_group(process.pid, signal.SIGKILL)
                process.wait(timeout=30)
        # Reap whatever it forked into its group that outlived it.
        self._signal_group(process.pid, signal.SIGKILL)

    @staticmethod
    def _signal_group(pgid: int, signum: int) -> None:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(pgid, signum)

    def log_tail(self, lines: int = 40) -> str:
        """The last lines of the server's log, for failure messages."""
        try:
            text = self.log_path.read_text(errors="replace")
        except OSError:
            return "(no log)"
        return "\n".join(text.splitlines()[-lines:])

    def wait_until(self, ready: Callable[[], bool], what: str, timeout: float = 60.0) -> None:
        """Poll ``ready`` until it holds; fail early if the process exits meanwhile."""
        deadline = time.monotonic() + timeout
        while True:
            if not self.running:
                code = self._process.returncode if self._process else None
                raise ServerFailed(
                    f"{self.name} exited (code {code}) before {what}; log {self.log_path}:\n"
                    + self.log_tail()
                )
            if ready():
                return
            if time.monotonic() > deadline:
                raise ServerFailed(
                    f"{self.name} not {what} after {timeout:.0f}s; log {self.log_path}:\n"
                    + self.log_tail()
                )
            time.sleep(0.1)
