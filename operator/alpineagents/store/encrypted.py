"""Encryption at rest: a store wrapper that saves each entry as AES-256-GCM ciphertext.

``EncryptedStore(store, keyring)`` wraps any :class:`~alpineagents.store.Store` (FileStore,
MinioStore, your own). What reaches the wrapped store:

- each history entry as ``{"seq": 12, "sealed": {"key": "k2", "nonce": "…", "data": "…"}}``:
  ``kind``, ``time``, ``text`` and ``data`` (messages, tool calls and results, model
  replies, errors) are one AES-GCM ciphertext. ``seq`` stays readable because stores use
  it to skip entries sent again and to order the history without the key.
- the info with the list fields readable and the rest sealed the same way. Readable:
  ``v`` (format), ``updated_at``, ``stopped``, ``parent_id``, ``entries``, ``turns`` and
  ``usage``: numbers, times and fixed words, none of them taken from the conversation,
  which the operator and ``list`` read to see how a run stands. Sealed:
  ``first_message``, ``answer`` and any field not named above. The readable fields are
  the sealed part's associated data: one changed (``stopped``, ``parent_id``, a count)
  makes the info fail to open instead of being read as genuine.

``key`` is the id of the key that sealed it, so keys rotate: a :class:`Keyring` holds
every key that may still be needed to read, and the newest one seals all new writes.
Each ciphertext is bound (as AES-GCM associated data) to its State id and its seq (or to
"info"), so an entry moved to another State or position fails to decrypt instead of
being read as genuine. Reading a plaintext entry through the wrapper is refused, unless
``read_plaintext=True`` (to go on with States saved before encryption was turned on).

Keys come from ``ALPINEAGENTS_ENCRYPTION_KEYS`` (or ``ALPINEAGENTS_ENCRYPTION_KEYS_FILE``,
naming a file such as a mounted Kubernetes Secret): items ``ID:BASE64`` separated by
commas or whitespace, each key 32 random bytes, the last item the one that writes.
``python -m alpineagents.store.encrypted new-key ID`` prints a new item. With a store URL,
``?encrypted=true`` turns the wrapper on (:func:`alpineagents.store.url.open_store`).
"""

from __future__ import annotations

import base64
import binascii
import builtins
import json
import logging
import os
import re
import secrets
import sys
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives.ciphers.aead import AESGCM

from ..errors import StateFormatError
from ..pod_contract import ENV_ENCRYPTION_KEYS
from ..state import SEALED, Record
from .base import StateInfo, Store
from .wrapped import WrappedStore

__all__ = [
    "KEYS_ENV",
    "READABLE_INFO",
    "DecryptionError",
    "EncryptedStore",
    "Keyring",
]

KEYS_ENV = ENV_ENCRYPTION_KEYS
"""The environment variable holding the keyring (``KEYS_ENV + "_FILE"``: a file holding it)."""

_BOUND, _BOUND_READABLE = "bound", "readable"  # the seal's note: readable fields are its AD
READABLE_INFO = frozenset({"v", "updated_at", "stopped", "parent_id", "entries", "turns", "usage"})
"""Info fields kept readable: how a run stands, never words of the conversation."""

_KEY_BYTES = 32  # AES-256
_NONCE_BYTES = 12  # GCM's standard nonce; random per seal (2^-32 collision bound at 2^32 seals)
_KEY_ID = re.compile(r"[A-Za-z0-9._-]{1,64}")
_ITEM_SEPARATOR = re.compile(r"[\s,]+")

_log = logging.getLogger(__name__)


class DecryptionError(StateFormatError):
    """A sealed value could not be opened: unknown key id, wrong key, or changed bytes."""


class Keyring:
    """AES-256-GCM keys by id. The newest key (``current``) seals; every key opens.

    ``keys`` in order, oldest first: ``[("k1", key1), ("k2", key2)]`` or a dict. The
    ``repr`` names the key ids, never the keys.
    """

    def __init__(self, keys: Mapping[str, bytes] | Sequence[tuple[str, bytes]]) -> None:
        pairs = list(keys.items()) if isinstance(keys, Mapping) else list(keys)
        if not pairs:
            raise ValueError("a Keyring needs at least one key")
        self._keys: dict[str, AESGCM] = {}
        for key_id, key in pairs:
            if not isinstance(key_id, str) or not _KEY_ID.fullmatch(key_id):
                raise ValueError(
                    f"encryption key id {key_id!r} is not 1-64 letters, digits, '.', '_' or '-'"
                )
            if key_id in self._keys:
                raise ValueError(f"encryption key id {key_id!r} is given twice")
            if len(key) != _KEY_BYTES:
                raise ValueError(
                    f"encryption key {key_id!r} has {len(key)} bytes; it must have "
                    f"{_KEY_BYTES} (make one with: python -m alpineagents.store.encrypted new-key ID)"
                )
            self._keys[key_id] = AESGCM(bytes(key))
        self.current = pairs[-1][0]
        """The id of the key that seals new writes (the last one given)."""

    @property
    def ids(self) -> builtins.list[str]:
        """The key ids, oldest first."""
        return list(self._keys)

    @classmethod
    def from_text(cls, text: str, *, source: str = KEYS_ENV) -> Keyring:
        """Parse ``"k1:BASE64, k2:BASE64"`` (commas or whitespace; the last one writes).

        ``source`` names where the text came from in error messages (never the text).
        """
        pairs = []
        for number, item in enumerate(i for i in _ITEM_SEPARATOR.split(text.strip()) if i):
            key_id, colon, encoded = item.partition(":")
            if not colon:
                raise ValueError(
                    f"{source}: item {number + 1} is not ID:BASE64 (make one with: "
                    f"python -m alpineagents.store.encrypted new-key ID)"
                )
            try:  # standard or URL-safe alphabet
                key = base64.b64decode(encoded.replace("-", "+").replace("_", "/"), validate=True)
            except (binascii.Error, ValueError):
                raise ValueError(f"{source}: the key of {key_id!r} is not base64") from None
            pairs.append((key_id, key))
        if not pairs:
            raise ValueError(f"{source} holds no keys: give ID:BASE64 items")
        return cls(pairs)

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None) -> Keyring | None:
        """The keyring in ``ALPINEAGENTS_ENCRYPTION_KEYS`` (or ``..._FILE``); None if unset."""
        env = os.environ if env is None else env
        text = env.get(KEYS_ENV)
        if text:
            return cls.from_text(text)
        path = env.get(KEYS_ENV + "_FILE")
        if not path:
            return None
        try:
            text = Path(path).read_text()
        except OSError as error:
            raise ValueError(
                f"{KEYS_ENV}_FILE names {path!r}, which cannot be read: {error.strerror}"
            ) from None
        return cls.from_text(text, source=f"{KEYS_ENV}_FILE ({path})")

    @staticmethod
    def new_item(key_id: str) -> str:
        """A new ``ID:BASE64`` item with 32 random bytes, to append to a keyring."""
        if not _KEY_ID.fullmatch(key_id):
            raise ValueError(f"key id {key_id!r} is not 1-64 letters, digits, '.', '_' or '-'")
        return f"{key_id}:{base64.b64encode(secrets.token_bytes(_KEY_BYTES)).decode()}"

    def seal(self, plaintext: bytes, context: bytes) -> dict[str, str]:
        """AES-GCM ``plaintext`` with the current key, bound to ``context``."""
        nonce = secrets.token_bytes(_NONCE_BYTES)
        data = self._keys[self.current].encrypt(nonce, plaintext, context)
        return {
            "key": self.current,
            "nonce": base64.b64encode(nonce).decode(),
            "data": base64.b64encode(data).decode(),
        }

    def open(self, sealed: Any, context: bytes) -> bytes:
        """The plaintext of a value made by :meth:`seal` with the same ``context``.

        Raises :class:`DecryptionError` for an unknown key id, a wrong key, or bytes that
        were changed (or moved from another State or position).
        """
        if not isinstance(sealed, Mapping):
            raise DecryptionError("not a sealed value")
        key_id = sealed.get("key")
        cipher = self._keys.get(key_id) if isinstance(key_id, str) else None
        if cipher is None:
            raise DecryptionError(
                f"sealed with key {key_id!r}, which is not in the keyring (it has "
                f"{', '.join(self._keys)}): add that key back to {KEYS_ENV} to read it"
            )
        try:
            nonce = base64.b64decode(str(sealed.get("nonce")), validate=True)
            data = base64.b64decode(str(sealed.get("data")), validate=True)
            return cipher.decrypt(nonce, data, context)
        except (binascii.Error, ValueError, InvalidTag):
            raise DecryptionError(
                f"the value sealed with key {key_id!r} does not decrypt: a different key "
                f"under that id, or the stored bytes were changed or moved"
            ) from None

    def __repr__(self) -> str:
        return f"Keyring(ids={self.ids!r}, current={self.current!r})"


class EncryptedStore(WrappedStore):
    """``store`` with every entry and the conversation's info fields sealed by ``keyring``.

    See the module docstring for what stays readable. ``read_plaintext=True`` also reads
    entries saved without encryption (new writes are sealed all the same). ``claim`` and
    ``ensure_bucket`` pass straight through (neither touches a conversation).
    """

    def __init__(self, store: Store, keyring: Keyring, *, read_plaintext: bool = False) -> None:
        if isinstance(store, EncryptedStore):
            raise TypeError("this store is encrypted already: wrap the store inside it")
        super().__init__(store)
        self.keyring = keyring
        self.read_plaintext = read_plaintext

    def same_as(self, other: Store) -> bool:
        # Never the plain store inside: a State saved here must not be saved there unsealed.
        return isinstance(other, EncryptedStore) and (
            other.inner is self.inner or self.inner.same_as(other.inner)
        )

    # ------------------------------------------------------------ hooks: seal, open
    def outgoing(
        self, state_id: str, entries: Iterable[dict[str, Any]], info: dict[str, Any]
    ) -> tuple[builtins.list[dict[str, Any]], dict[str, Any]]:
        sealed_entries = []
        for entry in entries:
            seq = int(entry["seq"])
            rest = {k: v for k, v in entry.items() if k != "seq"}
            sealed_entries.append(
                {"seq": seq, SEALED: self.keyring.seal(_json(rest), _entry_context(state_id, seq))}
            )
        return sealed_entries, seal_info(self.keyring, state_id, info)

    def incoming(self, state_id: str, record: Record) -> Record:
        entries = []
        for entry in record.entries:
            seq = int(entry["seq"])
            if SEALED not in entry:
                if not self.read_plaintext:
                    raise DecryptionError(
                        f"State {state_id!r}: entry {seq} in {self.inner!r} is not encrypted. "
                        f"It was saved without encryption (or written by someone without "
                        f"the key); open the store with read_plaintext=True to accept it"
                    )
                entries.append(entry)
                continue
            try:
                plain = self.keyring.open(entry[SEALED], _entry_context(state_id, seq))
            except DecryptionError as error:
                raise DecryptionError(f"State {state_id!r}, entry {seq}: {error}") from None
            entries.append({"seq": seq, **json.loads(plain)})
        return Record(entries, open_info(self.keyring, state_id, record.info, self.read_plaintext))

    def listed(self, saved: StateInfo) -> StateInfo:
        if not saved.extra:  # a store that lists without the raw info: nothing to open
            return saved
        try:
            info = open_info(self.keyring, saved.id, saved.extra, self.read_plaintext)
        except DecryptionError as error:
            # One State this keyring cannot open does not hide the others; what list shows
            # of it is its readable fields.
            _log.warning("list() shows only the readable fields of %r: %s", saved.id, error)
            info = {k: v for k, v in saved.extra.items() if k != SEALED}
        return StateInfo.from_info(saved.id, info)


def seal_info(keyring: Keyring, state_id: str, info: Mapping[str, Any]) -> dict[str, Any]:
    """``info`` with every field but :data:`READABLE_INFO` sealed into ``info["sealed"]``,
    the readable ones bound to it as associated data (changed, the info fails to open)."""
    readable = {k: v for k, v in info.items() if k in READABLE_INFO}
    rest = {k: v for k, v in info.items() if k not in READABLE_INFO}
    sealed = keyring.seal(_json(rest), _info_context(state_id, readable))
    return {**readable, SEALED: {**sealed, _BOUND: _BOUND_READABLE}}


def open_info(
    keyring: Keyring, state_id: str, info: Mapping[str, Any], read_plaintext: bool = False
) -> dict[str, Any]:
    """The info :func:`seal_info` sealed, whole again."""
    if SEALED not in info:
        if read_plaintext:
            return dict(info)
        raise DecryptionError(
            f"State {state_id!r}: its info is not encrypted; open the store with "
            f"read_plaintext=True to accept States saved without encryption"
        )
    readable = {k: v for k, v in info.items() if k in READABLE_INFO}
    sealed = info[SEALED]
    # Infos sealed before the readable fields were bound open as they were sealed.
    bound = isinstance(sealed, Mapping) and sealed.get(_BOUND) == _BOUND_READABLE
    context = _info_context(state_id, readable) if bound else _info_context(state_id)
    try:
        rest = json.loads(keyring.open(sealed, context))
    except DecryptionError as error:
        raise DecryptionError(f"State {state_id!r}, info: {error}") from None
    return {**{k: v for k, v in info.items() if k != SEALED}, **rest}


def _json(value: Any) -> bytes:
    return json.dumps(value, separators=(",", ":"), ensure_ascii=False).encode()


def _entry_context(state_id: str, seq: int) -> bytes:
    return b"alpineagents/entry/1\x00" + state_id.encode() + b"\x00" + str(seq).encode()


def _info_context(state_id: str, readable: Mapping[str, Any] | None = None) -> bytes:
    if readable is None:
        return b"alpineagents/info/1\x00" + state_id.encode()
    fields = json.dumps(readable, sort_keys=True, separators=(",", ":")).encode()
    return b"alpineagents/info/2\x00" + state_id.encode() + b"\x00" + fields


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m alpineagents.store.encrypted new-key ID``: print a new ``ID:BASE64`` item."""
    args = list(sys.argv[1:] if argv is None else argv)
    if len(args) != 2 or args[0] != "new-key":
        print("usage: python -m alpineagents.store.encrypted new-key ID", file=sys.stderr)
        return 2
    try:
        print(Keyring.new_item(args[1]))
    except ValueError as error:
        print(f"alpineagents.store.encrypted: {error}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
