"""Fork a saved run: a new State from the first entries of another, edited, run on from
there; the source is left as it was.

A fork is loaded as any saved State is, so the contract holds across it: a tool call in
flight at the fork's last entry ends ``aborted`` (never run again blindly), a model
request open there is taken back, approvals pending there stay pending, and usage and
cost start from the source's at that entry. The new State's info says where it came
from (``forked_from``: the source's id and entry), and a fork of a fork works the same.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from .messages import Message, excerpt
from .state import Record, State
from .store.base import Store

__all__ = ["fork"]


def fork(
    store: Store,
    source_id: str,
    at: int,
    fork_id: str,
    *,
    message: str | None = None,
    results: Mapping[str, str] | None = None,
) -> State:
    """Save entries 0..``at`` of State ``source_id`` as the new State ``fork_id`` in
    ``store`` and return it, ready to run on (as ``store.load`` would give it).

    ``message`` replaces entry ``at``, which must then be a user's message (the prompt or
    one sent later); ``results`` replaces the content of tool results among the entries
    copied, by call id (the result then reads as the tool's answer: outcome ``ok``).

    Raises ``LookupError`` when the source does not exist, ``ValueError`` naming what to
    change for an entry out of range, an edit that does not fit, or a ``fork_id`` that is
    taken (nothing is written then).
    """
    record = store.read(source_id)
    if record is None:
        raise LookupError(f"no saved State {source_id!r} to fork in {store!r}")
    entries = sorted(record.entries, key=lambda e: int(e["seq"]))
    if not 0 <= at < len(entries):
        raise ValueError(
            f"cannot fork {source_id!r} at entry {at}: it has entries 0 to {len(entries) - 1}"
        )
    copied = [dict(entry) for entry in entries[: at + 1]]
    if message is not None:
        copied[at] = _with_message(source_id, copied[at], message)
    for call_id, content in (results or {}).items():
        _replace_result(source_id, at, copied, call_id, content)
    info: dict[str, Any] = {
        **record.info,
        "parent_id": None,
        "forked_from": {"id": source_id, "entry": at},
    }
    state = State.from_record(fork_id, Record(copied, info))
    store.save(state)  # a new id: refused if taken, before anything is written
    return state


def _with_message(source_id: str, entry: dict[str, Any], text: str) -> dict[str, Any]:
    data = entry.get("data") or {}
    raw = data.get("message") if entry.get("kind") == "message" else None
    if not isinstance(raw, Mapping) or raw.get("role") != "user":
        raise ValueError(
            f"entry {entry.get('seq')} of {source_id!r} is a {entry.get('kind')} entry, not a "
            f"user's message: to change a message, fork at the entry that holds it"
        )
    replaced = Message.user(text)
    return {**entry, "text": text, "data": {**data, "message": replaced.to_dict()}}


def _replace_result(
    source_id: str, at: int, entries: list[dict[str, Any]], call_id: str, content: str
) -> None:
    for index, entry in enumerate(entries):
        data = entry.get("data") or {}
        if entry.get("kind") == "tool_result" and data.get("call_id") == call_id:
            entries[index] = {
                **entry,
                "text": excerpt(content),
                "data": {**data, "content": content, "outcome": "ok"},
            }
            return
    raise ValueError(
        f"no result of call {call_id!r} in entries 0 to {at} of {source_id!r}: "
        f"`alpineagents show {source_id}` names each call's id"
    )
