"""One way to name a store in configuration: a URL, shared by the runner, CLI and operator.

- ``file:///abs/path`` or a plain path (``.agent-runs``, ``/var/runs``): a FileStore.
- ``s3://bucket/prefix?endpoint=host:port&secure=false&region=us-east-1``: a MinioStore.
  Options (all optional): ``endpoint`` (``host:port``, or ``http://host:port`` /
  ``https://host:port`` which also sets ``secure``; default ``$AWS_ENDPOINT_URL`` or
  ``s3.amazonaws.com``), ``secure`` (default true), ``region`` (default ``$AWS_REGION``,
  ``$AWS_DEFAULT_REGION`` or ``us-east-1``), ``timeout`` and ``retry_budget`` (seconds),
  ``create_bucket`` (default true).
- Either kind takes ``encrypted=true``: the store is wrapped in an
  :class:`~alpineagents.store.encrypted.EncryptedStore` with the keys in
  ``ALPINEAGENTS_ENCRYPTION_KEYS`` (or ``ALPINEAGENTS_ENCRYPTION_KEYS_FILE``).

Credentials never go in the URL (it ends up in logs and resource specs); they come from
the environment: ``AWS_ACCESS_KEY_ID``/``AWS_SECRET_ACCESS_KEY`` (and
``AWS_SESSION_TOKEN``), else ``MINIO_ACCESS_KEY``/``MINIO_SECRET_KEY``, each also as a
``*_FILE`` variable naming a file that holds it (a mounted Kubernetes Secret).
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any
from urllib.parse import parse_qs, parse_qsl, unquote, urlencode, urlsplit, urlunsplit

from .base import Store
from .file import FileStore

if TYPE_CHECKING:
    from .s3 import MinioStore

__all__ = ["S3Credentials", "S3Location", "open_store", "redact", "s3_credentials", "s3_location"]

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
    url, encrypted = _encryption_option(url)
    store = _plain_store(url, env)
    if not encrypted:
        return store
    from .encrypted import EncryptedStore, Keyring  # needs the optional `cryptography`

    keyring = Keyring.from_env(env)
    if keyring is None:
        raise ValueError(
            f"store URL {redact(url)!r} asks for encryption (encrypted=true) but "
            f"ALPINEAGENTS_ENCRYPTION_KEYS (or ALPINEAGENTS_ENCRYPTION_KEYS_FILE) is not set: "
            f"give the keys (python -m alpineagents.store.encrypted new-key ID makes one)"
        )
    return EncryptedStore(store, keyring)


def _plain_store(url: str, env: Mapping[str, str]) -> Store:
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


def _encryption_option(url: str) -> tuple[str, bool]:
    """``url`` without its ``encrypted`` option, and whether that option was true."""
    if not _HAS_SCHEME.match(url):
        return url, False
    parts = urlsplit(url)
    pairs = parse_qsl(parts.query, keep_blank_values=True)
    chosen = [value for name, value in pairs if name == "encrypted"]
    if not chosen:
        return url, False
    rest = urlencode([(name, value) for name, value in pairs if name != "encrypted"])
    return urlunsplit(parts._replace(query=rest)), _flag(chosen[-1], "encrypted", url)


@dataclass(frozen=True)
class S3Location:
    """Where an ``s3://`` store URL points, with its options (never credentials)."""

    bucket: str
    prefix: str
    """The key prefix as the URL path gives it (MinioStore normalizes it)."""
    endpoint: str
    """``host:port``."""
    secure: bool
    region: str
    timeout: float
    retry_budget: float
    create_bucket: bool

    @property
    def endpoint_url(self) -> str:
        """``http(s)://host:port``: where the S3 (and STS) API answers."""
        return f"{'https' if self.secure else 'http'}://{self.endpoint}"


@dataclass(frozen=True)
class S3Credentials:
    """The credentials the environment gives an ``s3://`` store; secrets kept out of repr."""

    access_key: str
    secret_key: str = field(repr=False)
    session_token: str | None = field(default=None, repr=False)
    files: tuple[str, str, str | None] | None = None
    """The files they were read from (``*_FILE`` variables), read again when they change."""


def s3_location(url: str, env: Mapping[str, str] | None = None) -> S3Location:
    """Parse an ``s3://bucket/prefix?options`` URL (see the module docstring)."""
    env = os.environ if env is None else env
    url, _ = _encryption_option(url)
    parts = urlsplit(url)
    if parts.scheme.lower() != "s3":
        raise ValueError(f"store URL {redact(url)!r} is not an s3:// URL")
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
    region = option.get("region") or env.get("AWS_REGION") or env.get("AWS_DEFAULT_REGION")
    return S3Location(
        bucket=bucket,
        prefix=unquote(parts.path),
        endpoint=endpoint,
        secure=secure,
        region=region or "us-east-1",
        timeout=_seconds(option.get("timeout", "5"), "timeout", url),
        retry_budget=_seconds(option.get("retry_budget", "10"), "retry_budget", url),
        create_bucket=_flag(option.get("create_bucket", "true"), "create_bucket", url),
    )


def _s3_store(url: str, env: Mapping[str, str]) -> MinioStore:
    from .s3 import MinioStore  # needs the optional `minio` dependency

    where = s3_location(url, env)
    credentials = s3_credentials(url, env)
    options: dict[str, Any] = {}
    if credentials.files is not None:
        from .s3.credential_files import CredentialFiles

        # Read again when they change: the operator renews a run's short-lived
        # credentials in its Secret, and the kubelet updates the mounted files.
        options["credentials"] = CredentialFiles(*credentials.files)
    else:
        options["access_key"] = credentials.access_key
        options["secret_key"] = credentials.secret_key
        options["session_token"] = credentials.session_token
    return MinioStore.connect(
        where.endpoint,
        where.bucket,
        where.prefix,
        secure=where.secure,
        region=where.region,
        timeout=where.timeout,
        retry_budget=where.retry_budget,
        create_bucket=where.create_bucket,
        **options,
    )


def s3_credentials(url: str, env: Mapping[str, str] | None = None) -> S3Credentials:
    """The credentials for the store at ``url`` from ``env`` (default os.environ).

    ``AWS_ACCESS_KEY_ID``/``AWS_SECRET_ACCESS_KEY`` (+ ``AWS_SESSION_TOKEN``), else
    ``MINIO_ACCESS_KEY``/``MINIO_SECRET_KEY``, each also as ``*_FILE``. Raises
    ``ValueError`` naming what is missing.
    """
    env = os.environ if env is None else env
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
        token = _secret(env, token_name) if token_name else None
        files = None
        from_files = not any(
            env.get(name) for name in (access_name, secret_name, token_name) if name
        )
        if from_files:
            token_file = env.get(f"{token_name}_FILE") if token_name else None
            files = (env[access_name + "_FILE"], env[secret_name + "_FILE"], token_file or None)
        return S3Credentials(access, secret, token, files)
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
