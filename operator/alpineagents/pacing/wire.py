"""The shared limiter's HTTP/1.1: one JSON exchange per connection, read and written the
same way by the service (:mod:`.service`) and the runs (:mod:`.shared`)."""

from __future__ import annotations

import asyncio

__all__ = ["MAX_BODY", "head", "read_message"]

MAX_BODY = 64 * 1024


async def read_message(reader: asyncio.StreamReader) -> tuple[list[str], bytes]:
    """A request's or a response's first line (split on spaces) and its body (by
    ``content-length``); ``ValueError`` for a body over :data:`MAX_BODY`."""
    first = (await reader.readline()).decode("latin-1").split()
    length = 0
    while (line := await reader.readline()) not in (b"\r\n", b"\n", b""):
        name, _, value = line.decode("latin-1").partition(":")
        if name.strip().lower() == "content-length":
            length = int(value.strip() or 0)
    if length > MAX_BODY:
        raise ValueError(f"a body of {length} bytes (at most {MAX_BODY})")
    return first, await reader.readexactly(length) if length else b""


def head(first_line: str, content_type: str, length: int) -> bytes:
    """The first line and headers of a message with a body of ``length`` bytes."""
    return (
        f"{first_line}\r\ncontent-type: {content_type}\r\ncontent-length: {length}\r\n"
        "connection: close\r\n\r\n"
    ).encode()
