"""S3 credentials read from files that may change under a running process.

A run pod gets short-lived store credentials in a Secret mounted as files; the operator
renews them before they expire, and the kubelet swaps the files in place (one atomic
symlink change for all of them). :class:`CredentialFiles` is a ``minio`` credentials
provider that notices the change and reads the files again, so a long run keeps saving
across renewals without a restart.
"""

from __future__ import annotations

import os
import threading
from pathlib import Path

from minio.credentials.credentials import Credentials
from minio.credentials.providers import Provider

__all__ = ["CredentialFiles"]

_READ_ATTEMPTS = 5  # a renewal landing while the files are read: read them again


class CredentialFiles(Provider):
    """Credentials from ``access_key_file``, ``secret_key_file`` and ``session_token_file``.

    Each request stats the files (cheap, no reads); when one changed since the last read,
    all of them are read again together.
    """

    def __init__(
        self,
        access_key_file: str | os.PathLike[str],
        secret_key_file: str | os.PathLike[str],
        session_token_file: str | os.PathLike[str] | None = None,
    ) -> None:
        self._paths = [Path(access_key_file), Path(secret_key_file)]
        if session_token_file is not None:
            self._paths.append(Path(session_token_file))
        self._lock = threading.Lock()
        self._seen: tuple[tuple[int, int, int], ...] | None = None
        self._credentials: Credentials | None = None

    def retrieve(self) -> Credentials:
        with self._lock:
            for _ in range(_READ_ATTEMPTS):
                before = self._stamps()
                if before == self._seen and self._credentials is not None:
                    return self._credentials
                values = [path.read_text().strip() for path in self._paths]
                if self._stamps() != before:
                    continue  # swapped while we read: read the new set
                for path, value in zip(self._paths, values, strict=True):
                    if not value:
                        raise ValueError(f"the credentials file {path} is empty")
                self._credentials = Credentials(
                    access_key=values[0],
                    secret_key=values[1],
                    session_token=values[2] if len(values) > 2 else None,
                )
                self._seen = before
                return self._credentials
            raise RuntimeError(
                f"the credentials files {', '.join(map(str, self._paths))} kept changing "
                f"while they were read"
            )

    def _stamps(self) -> tuple[tuple[int, int, int], ...]:
        stamps = []
        for path in self._paths:
            info = path.stat()  # follows the kubelet's ..data symlinks to the current file
            stamps.append((info.st_ino, info.st_mtime_ns, info.st_size))
        return tuple(stamps)

    def __repr__(self) -> str:
        return f"CredentialFiles({', '.join(map(str, self._paths))})"
