"""The operator as a real process (``python -m alpineagents_operator``), for e2e tests and
benchmarks.

:class:`OperatorProcess` starts it with a kubeconfig and an environment (its
configuration, see ``alpineagents_operator.config``), waits for its liveness endpoint,
and can stop it gracefully (SIGTERM), kill it hard (SIGKILL, as a crash) and start it
again on the same ports. Its log is a file; :meth:`log_tail` shows the end of it.
"""

from __future__ import annotations

import contextlib
import os
import signal
import sys
import urllib.error
import urllib.request
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from tests.bench.infra import free_port
from tests.bench.server_process import ServerProcess


def bench_env(store_url: str, s3: Any, model_url: str, **extra: str) -> dict[str, str]:
    """The operator's configuration on the test bench: an S3 store on ``s3`` (a bench
    ``S3Server``), Secrets named ``store-credentials`` and ``anthropic``, the scripted model."""
    return {
        "ALPINEAGENTS_STORE": store_url,
        "ALPINEAGENTS_STORE_SECRET": "store-credentials",
        "ALPINEAGENTS_ANTHROPIC_SECRET": "anthropic",
        "ANTHROPIC_BASE_URL": model_url,
        "AWS_ACCESS_KEY_ID": s3.access_key,
        "AWS_SECRET_ACCESS_KEY": s3.secret_key,
        **extra,
    }


class OperatorProcess:
    """One operator process; ``env`` is its configuration (ALPINEAGENTS_*, AWS_*, ...)."""

    def __init__(self, kubeconfig: Path, workdir: Path, env: Mapping[str, str]) -> None:
        self.health_port = free_port()
        self.metrics_port = free_port()
        self.workdir = workdir
        full_env = {
            "PATH": os.environ.get("PATH", os.defpath),
            "HOME": str(workdir),
            "KUBECONFIG": str(kubeconfig),
            "PYTHONUNBUFFERED": "1",
            "ALPINEAGENTS_HEALTH_PORT": str(self.health_port),
            "ALPINEAGENTS_METRICS_PORT": str(self.metrics_port),
            **env,
        }
        if os.environ.get("PYTHONPATH"):
            full_env.setdefault("PYTHONPATH", os.environ["PYTHONPATH"])
        self.process = ServerProcess(
            "alpineagents-operator",
            [sys.executable, "-m", "alpineagents_operator"],
            workdir / "operator.log",
            env=full_env,
            cwd=workdir,
        )

    @property
    def health_url(self) -> str:
        return f"http://127.0.0.1:{self.health_port}/healthz"

    @property
    def pid(self) -> int | None:
        return self.process.pid

    def start(self, timeout: float = 60.0) -> None:
        """Start the operator and wait until its liveness endpoint answers 200."""
        self.process.start()
        self.process.wait_until(lambda: self._health() == 200, "healthy", timeout=timeout)

    def stop(self) -> None:
        """SIGTERM, as Kubernetes stops it; SIGKILL if it lingers."""
        self.process.stop()

    def kill(self) -> None:
        """SIGKILL, as a crash or an OOM kill of the operator: no cleanup at all."""
        pid = self.process.pid
        if pid is None:
            return
        with contextlib.suppress(ProcessLookupError):
            os.killpg(pid, signal.SIGKILL)
        self.process.stop()  # reaps it

    def metrics(self) -> str:
        """The Prometheus exposition text of the operator's /metrics."""
        with urllib.request.urlopen(
            f"http://127.0.0.1:{self.metrics_port}/metrics", timeout=5
        ) as r:
            return str(r.read().decode())

    def log_tail(self, lines: int = 60) -> str:
        return self.process.log_tail(lines)

    def _health(self) -> int:
        try:
            with urllib.request.urlopen(self.health_url, timeout=2) as response:
                return int(response.status)
        except urllib.error.HTTPError as error:
            return int(error.code)
        except OSError:
            return 0
