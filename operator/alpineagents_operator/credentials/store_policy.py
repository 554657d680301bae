"""Where the operator's store key may go: the configured store, and folders under it.

The operator reads, claims and (``onDelete: Delete``) deletes a run's State, creates its
bucket and mints its pod's credentials, all with its own broad key, at the run's
``spec.store``. So ``spec.store`` may only point where the operator's configuration
already does (:func:`store_refusal`):

- the same endpoint (scheme, host and port) and the same bucket as ``ALPINEAGENTS_STORE``
  or one of ``ALPINEAGENTS_ALLOWED_STORES`` (file stores: the same folder);
- a prefix equal to that store's, or under it by plain parts (letters, digits, ``.``,
  ``_``, ``-``: no ``%``, so no part can be a State's folder, whose encoded id always
  holds ``%2E``, and no part made of dots only);
- ``encrypted=true`` when that store has it.

Anything else is refused from the URL alone, before any request leaves the operator: no
bucket created, no credentials minted, no host contacted. :func:`guarded_opener` wraps the
operator's ``open_store`` so no code path can open a store the policy refuses.
"""

from __future__ import annotations

import os
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from urllib.parse import parse_qsl, unquote, urlsplit

from alpineagents import Store
from alpineagents.store.url import redact, s3_location
from alpineagents_operator.kube.config import OperatorConfig

__all__ = ["StoreNotAllowed", "guarded_opener", "store_refusal"]

_HAS_SCHEME = re.compile(r"[A-Za-z][A-Za-z0-9+.-]*://")
_PLAIN_PART = re.compile(r"(?!\.+$)[A-Za-z0-9._-]+")


class StoreNotAllowed(ValueError):
    """A store URL outside what the operator's configuration allows (see the module)."""


@dataclass(frozen=True)
class _Place:
    """Where a store URL points, as far as the policy compares: kind, endpoint, bucket,
    prefix parts and whether it is encrypted."""

    kind: str
    """``s3`` or ``file``."""
    endpoint: str
    """``http(s)://host:port`` (lowercase, with the port); ``""`` for a file store."""
    bucket: str
    """The bucket; for a file store ``/`` (an absolute folder) or ``""`` (relative)."""
    parts: tuple[str, ...]
    """The prefix (or folder) split at ``/``, without empty parts at its ends."""
    encrypted: bool

    def describe(self) -> str:
        where = "/".join(self.parts)
        if self.kind == "file":
            return f"folder {self.bucket}{where}"
        return f"s3://{self.bucket}/{where} at {self.endpoint}"


def store_refusal(
    url: str, config: OperatorConfig, env: Mapping[str, str] | None = None
) -> str | None:
    """Why the operator may not use store ``url`` with its key (None: it may).

    ``url`` is allowed when it is the configured store itself, or lies under it or under
    one of the allowed stores (see the module). ``env`` (default ``os.environ``) gives
    the endpoint an ``s3://`` URL without ``endpoint=`` means, as the store would.
    """
    env = os.environ if env is None else env
    if url == config.store:
        return None
    bases = (config.store, *config.allowed_stores)
    try:
        wanted = _place(url, env)
    except ValueError as error:
        return f"spec.store {redact(url)!r} is not a store URL the operator can use: {error}"
    problems = []
    for base_url in bases:
        try:
            base = _place(base_url, env)
        except ValueError:
            continue  # a configured store the operator cannot parse serves no run
        problem = _outside(wanted, base)
        if problem is None:
            return None
        problems.append(problem)
    allowed = " or ".join(redact(b) for b in bases)
    return (
        f"spec.store {redact(url)!r} is outside the stores this operator uses its key for "
        f"({'; '.join(dict.fromkeys(problems))}): point it at {allowed} or a folder under "
        f"it, or ask the operator's admin to add it to store.allowedStores "
        f"(ALPINEAGENTS_ALLOWED_STORES)"
    )


def guarded_opener(
    open_store: Callable[[str], Store], config: OperatorConfig
) -> Callable[[str], Store]:
    """``open_store`` that raises :class:`StoreNotAllowed` for a URL the policy refuses,
    before it opens (and so contacts) anything."""

    def open_allowed(url: str) -> Store:
        problem = store_refusal(url, config)
        if problem is not None:
            raise StoreNotAllowed(problem)
        return open_store(url)

    return open_allowed


# ------------------------------------------------------------------------------ internals
def _outside(wanted: _Place, base: _Place) -> str | None:
    """Why ``wanted`` is not at or under ``base`` (None: it is)."""
    if wanted.kind != base.kind:
        return f"a {wanted.kind} store, not {base.kind}"
    if wanted.endpoint != base.endpoint:
        return f"endpoint {wanted.endpoint}, not {base.endpoint}"
    if wanted.bucket != base.bucket and wanted.kind == "s3":
        return f"bucket {wanted.bucket!r}, not {base.bucket!r}"
    if wanted.bucket != base.bucket or wanted.parts[: len(base.parts)] != base.parts:
        return f"{wanted.describe()} is not under {base.describe()}"
    below = wanted.parts[len(base.parts) :]
    odd = [part for part in below if not _PLAIN_PART.fullmatch(part)]
    if odd:
        return (
            f"prefix part {odd[0]!r} is not plain (letters, digits, '.', '_', '-'; not "
            f"only dots): it could name another run's folder"
        )
    if base.encrypted and not wanted.encrypted:
        return "it drops encrypted=true, which the operator's store has"
    return None


def _place(url: str, env: Mapping[str, str]) -> _Place:
    if not _HAS_SCHEME.match(url):
        return _Place("file", "", _root(url), _parts(url, url), encrypted=False)
    split = urlsplit(url)
    pairs = parse_qsl(split.query, keep_blank_values=True)
    encrypted = any(name == "encrypted" and value.lower() == "true" for name, value in pairs)
    scheme = split.scheme.lower()
    if scheme == "file":
        if split.netloc not in ("", "localhost"):
            raise ValueError(f"a file store names no host (got {split.netloc!r})")
        path = unquote(split.path)
        return _Place("file", "", _root(path), _parts(path, url), encrypted)
    if scheme != "s3":
        raise ValueError(f"unknown scheme {split.scheme!r}")
    where = s3_location(url, env)
    host, _, port = where.endpoint.lower().rpartition(":")
    if not host or not port.isdigit():
        host, port = where.endpoint.lower(), "443" if where.secure else "80"
    scheme_name = "https" if where.secure else "http"
    return _Place(
        "s3", f"{scheme_name}://{host}:{port}", where.bucket, _parts(where.prefix, url), encrypted
    )


def _root(path: str) -> str:
    return "/" if path.startswith("/") else ""


def _parts(path: str, url: str) -> tuple[str, ...]:
    inner = path.strip("/")
    if not inner:
        return ()
    parts: Sequence[str] = inner.split("/")
    if any(part in ("", ".", "..") for part in parts):
        raise ValueError(f"{redact(url)!r} has an empty, '.' or '..' part in its path")
    return tuple(parts)
