"""One way to name a store in configuration: a URL, shared by the runner, CLI and operator.

- ``file:///abs/path`` or a plain path (``.agent-runs``, ``/var/runs``): a FileStore.
- ``s3://bucket/prefix?endpoint=host:port&secure=false&region=us-east-1``: a MinioStore.
  Options (all optional): ``endpoint`` (``host:port``, or ``http://host:port`` /
  ``https://host:port`` which also sets ``secure``; default ``$AWS_ENDPOINT_URL`` or
  ``s3.amazonaws.com``), ``secure`` (default true), ``region`` (default ``$AWS_REGION``,
  ``$AWS_DEFAULT_REGION`` or ``us-east-1``), ``timeout`` and ``retry_budget`` (seconds),
  ``create_bucket`` (default true).

Credentials never go in the URL (it ends up in logs and resource specs); they come from
the environment: ``AWS_ACCESS_KEY_ID``/``AWS_SECRET_ACCESS_KEY`` (and
``AWS_SESSION_TOKEN``), else ``MINIO_ACCESS_KEY``/``MINIO_SECRET_KEY``, each also as a
``*_FILE`` variable naming a file that holds it (a mounted Kubernetes Secret).
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING
from urllib.parse import parse_qs, unquote, urlsplit, urlunsplit

from .base import Store
from .file import FileStore

if TYPE_CHECKING:
    from .s3 import MinioStore

__all__ = ["open_store", "redact"]

SCHEMES = ("file", "s3")
_HAS_SCHEME = re.compile(r"[A-Za-z][A-Za-z0-9+.-]*://")
_S3_OPTIONS = ("endpoint", "secure", "region", "timeout", "retry_budget", "create_bucket")
_CREDENTIALS = (
    ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN"),
    ("MINIO_ACCESS_KEY", "MINIO_SECRET_KEY", None),
)


def open_store(url: str, env: Mapping[str, str] | None = None) -> Store:
    """The store a URL names (see the module docstring); ``env`` defaults to os.environ.

    Raises ``ValueError`` for an unknown scheme, a malformed URL, credentials in the URL
    or missing credentials for ``s3://``.
    """
    env = os.environ if env is None else env
    if not url:
        raise ValueError("a store URL must not be empty: use a path, file:///path or s3://")
    if not _HAS_SCHEME.match(url):
        return FileStore(Path(url).expanduser())
    parts = urlsplit(url)
    scheme = parts.scheme.lower()
    if scheme == "file":
        if parts.netloc not in ("", "localhost"):
            raise ValueError(
                f"file store URL {redact(url)!r} names host {parts.netloc!r}: write "
                f"file:///absolute/path (three slashes) or a plain path"
            )
        if parts.query:
            raise ValueError(f"file store URL {redact(url)!r} takes no options")
        return FileStore(Path(unquote(parts.path)))
    if scheme == "s3":
        return _s3_store(url, env)
    raise ValueError(
        f"unknown store URL scheme {parts.scheme!r} in {redact(url)!r}: use a path, "
        f"file:///path or s3://bucket/prefix?endpoint=host:port"
    )


def redact(url: str) -> str:
    """``url`` fit for logs: any user name or password in it is replaced by ``***``."""
    try:
        parts = urlsplit(url)
    except ValueError:
        return "<unparsable store URL>"
    if "@" not in parts.netloc:
        return url
    host = parts.netloc.rsplit("@", 1)[1]
    return urlunsplit(parts._replace(netloc="***@" + host))


def _s3_store(url: str, env: Mapping[str, str]) -> MinioStore:
    from .s3 import MinioStore  # needs the optional `minio` dependency

    parts = urlsplit(url)
    if "@" in parts.netloc:
        raise ValueError(
            f"store URL {redact(url)!r} holds credentials: they do not go in the URL; set "
            f"AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY (or their *_FILE variants)"
        )
    bucket = parts.netloc
    if not bucket:
        raise ValueError(f"store URL {redact(url)!r} names no bucket: s3://bucket/prefix")
    query = parse_qs(parts.query, keep_blank_values=True, strict_parsing=False)
    unknown = sorted(set(query) - set(_S3_OPTIONS))
    if unknown:
        raise ValueError(
            f"store URL {redact(url)!r} has unknown option(s) {', '.join(unknown)}; "
            f"known: {', '.join(_S3_OPTIONS)}"
        )
    option = {name: values[-1] for name, values in query.items()}
    endpoint = option.get("endpoint") or env.get("AWS_ENDPOINT_URL") or "s3.amazonaws.com"
    secure = _flag(option.get("secure", "true"), "secure", url)
    if "://" in endpoint:
        where = urlsplit(endpoint)
        if where.scheme not in ("http", "https") or not where.netloc:
            raise ValueError(f"store URL {redact(url)!r}: endpoint {endpoint!r} is not a URL")
        secure = where.scheme == "https"
        endpoint = where.netloc
    region = option.get("region") or env.get("AWS_REGION") or env.get("AWS_DEFAULT_REGION") or None
    access_key, secret_key, token = _credentials(env, url)
    return MinioStore.connect(
        endpoint,
        bucket,
        unquote(parts.path),
        access_key=access_key,
        secret_key=secret_key,
        session_token=token,
        secure=secure,
        region=region or "us-east-1",
        timeout=_seconds(option.get("timeout", "5"), "timeout", url),
        retry_budget=_seconds(option.get("retry_budget", "10"), "retry_budget", url),
        create_bucket=_flag(option.get("create_bucket", "true"), "create_bucket", url),
    )


def _credentials(env: Mapping[str, str], url: str) -> tuple[str, str, str | None]:
    for access_name, secret_name, token_name in _CREDENTIALS:
        access = _secret(env, access_name)
        secret = _secret(env, secret_name)
        if access is None and secret is None:
            continue
        if access is None or secret is None:
            have, lack = (
                (access_name, secret_name) if secret is None else (secret_name, access_name)
            )
            raise ValueError(
                f"{have} is set but {lack} (or {lack}_FILE) is not: the store "
                f"{redact(url)!r} needs both"
            )
        return access, secret, _secret(env, token_name) if token_name else None
    raise ValueError(
        f"no credentials for the store {redact(url)!r}: set AWS_ACCESS_KEY_ID and "
        f"AWS_SECRET_ACCESS_KEY, or MINIO_ACCESS_KEY and MINIO_SECRET_KEY (or their *_FILE "
        f"variants naming a file that holds the value)"
    )


def _secret(env: Mapping[str, str], name: str) -> str | None:
    value = env.get(name)
    if value:
        return value
    path = env.get(name + "_FILE")
    if not path:
        return None
    try:
        text = Path(path).read_text().strip()
    except OSError as error:
        raise ValueError(f"{name}_FILE names {path!r}, which cannot be read: {error}") from None
    if not text:
        raise ValueError(f"{name}_FILE names {path!r}, which is empty")
    return text


def _flag(value: str, name: str, url: str) -> bool:
    lowered = value.strip().lower()
    if lowered in ("1", "true", "yes", "on"):
        return True
    if lowered in ("0", "false", "no", "off"):
        return False
    raise ValueError(f"store URL {redact(url)!r}: {name}={value!r} is not true or false")


def _seconds(value: str, name: str, url: str) -> float:
    try:
        seconds = float(value)
    except ValueError:
        seconds = -1.0
    if not seconds > 0:
        raise ValueError(f"store URL {redact(url)!r}: {name}={value!r} is not a positive number")
    return seconds
