"""A throwaway PostgreSQL server on loopback, for LangGraph's PostgresSaver.

Uses the distribution's PostgreSQL (Debian: ``apt-get install postgresql``) from
``/usr/lib/postgresql/<version>/bin``: ``initdb`` in a temporary folder, ``postgres`` on a
free loopback port with its socket in that folder, default durability settings (fsync
and synchronous_commit on, as a production server has them). PostgreSQL refuses to run
as root, so as root the server runs as the ``postgres`` user.
"""

from __future__ import annotations

import contextlib
import os
import pwd
import shutil
import socket
import subprocess
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

STARTUP = 60.0  # seconds the server may take to accept connections (a safety net)


class PostgresUnavailable(RuntimeError):
    """No PostgreSQL could be started here (not installed, or it failed to start)."""


def _bin_dir() -> Path:
    root = Path("/usr/lib/postgresql")
    versions = sorted(
        (p for p in root.glob("*/bin") if (p / "postgres").exists()),
        key=lambda p: int(p.parent.name) if p.parent.name.isdigit() else 0,
    )
    if not versions:
        raise PostgresUnavailable(
            "PostgreSQL is not installed (apt-get install postgresql): the Postgres rows are "
            "not measured"
        )
    return versions[-1]


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


@contextlib.contextmanager
def postgres() -> Iterator[str]:
    """Start a server; yield a libpq connection string to its ``postgres`` database."""
    bins = _bin_dir()
    folder = Path(tempfile.mkdtemp(prefix="alpineagents-bench-pg-"))
    user: list[str] = []
    if os.geteuid() == 0:
        try:
            account = pwd.getpwnam("postgres")
        except KeyError as error:
            raise PostgresUnavailable("running as root and there is no 'postgres' user") from error
        os.chown(folder, account.pw_uid, account.pw_gid)
        user = ["runuser", "-u", "postgres", "--"]
    data, port = folder / "data", _free_port()
    log = folder / "server.log"
    process: subprocess.Popen[bytes] | None = None
    try:
        subprocess.run(
            [*user, str(bins / "initdb"), "-D", str(data), "-U", "bench", "--auth=trust"],
            check=True,
            capture_output=True,
        )
        with open(log, "wb") as output:
            process = subprocess.Popen(
                [
                    *user,
                    str(bins / "postgres"),
                    "-D",
                    str(data),
                    "-h",
                    "127.0.0.1",
                    "-p",
                    str(port),
                    "-k",
                    str(folder),
                ],
                stdout=output,
                stderr=subprocess.STDOUT,
            )
        url = f"postgresql://bench@127.0.0.1:{port}/postgres"
        _wait_ready(url, process, log)
        yield url
    except (OSError, subprocess.CalledProcessError) as error:
        detail = getattr(error, "stderr", b"") or b""
        raise PostgresUnavailable(
            f"PostgreSQL did not start: {error} {detail.decode(errors='replace')[-300:]}"
        ) from error
    finally:
        if process is not None and process.poll() is None:
            process.terminate()  # smart shutdown; the data is thrown away anyway
            try:
                process.wait(timeout=STARTUP)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()
        shutil.rmtree(folder, ignore_errors=True)


def _wait_ready(url: str, process: subprocess.Popen[bytes], log: Path) -> None:
    import psycopg

    deadline = time.monotonic() + STARTUP
    while True:
        if process.poll() is not None:
            raise PostgresUnavailable(f"PostgreSQL exited: {log.read_text()[-500:]}")
        try:
            with psycopg.connect(url, connect_timeout=2):
                return
        except psycopg.OperationalError as error:
            if time.monotonic() > deadline:
                raise PostgresUnavailable(
                    f"PostgreSQL did not accept connections: {log}"
                ) from error
            time.sleep(0.1)


def fresh_database(url: str, name: str) -> str:
    """Create database ``name`` on the server of ``url``; return its connection string."""
    import psycopg

    with psycopg.connect(url, autocommit=True) as connection:
        connection.execute(f'DROP DATABASE IF EXISTS "{name}"')
        connection.execute(f'CREATE DATABASE "{name}"')
    return url.rsplit("/", 1)[0] + "/" + name
