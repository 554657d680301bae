"""The Messages API's bill for a prompt: token counts, prompt caching and the window.

Pure bookkeeping that :class:`~alpineagents.testing.ModelServer` calls for each request,
so a test or a benchmark sees what the API would charge:

- :func:`count_tokens` counts a prompt as the server does: about 4 characters a token of
  the canonical JSON of ``{"tools", "system", "messages"}`` (a string ``system`` or message
  ``content`` counts as one text block; ``cache_control`` keys are not counted). An agent
  that wants to watch the window can mirror it exactly.
- :class:`Prompt` is one request read for caching: its blocks in the API's order (tools,
  then system, then messages), its ``cache_control`` breakpoints (on tool definitions,
  system blocks, message content blocks, and the request's top-level ``cache_control``,
  which marks the last cacheable block) checked as the API checks them (at most 4; a
  ``1h`` one never after a ``5m`` one), and the token count and cache key of each prefix
  it may need.
- :class:`PromptCache` prices a :class:`Prompt` as :class:`Usage`: for each breakpoint it
  looks for a live entry at that prefix and at the 20 block boundaries before it (the
  API's lookback) and reads the longest found; it then writes every breakpoint past that
  point whose prefix has at least ``min_cacheable_tokens`` (shorter ones are silently not
  cached, as the API does). An entry lives its TTL (5 minutes or 1 hour) from its last
  write or read. Entries are keyed by a hash of the model name and the prefix, so memory
  stays small however long the prompts are.
- :class:`Bill` sums what a server charged, in tokens and in input-price units (a 5m
  write costs 1.25 units a token, a 1h write 2, a read 0.1, the rest 1).
"""

from __future__ import annotations

import hashlib
import json
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

__all__ = [
    "DEFAULT_MIN_CACHEABLE_TOKENS",
    "LOOKBACK_BLOCKS",
    "MAX_BREAKPOINTS",
    "Bill",
    "Prompt",
    "PromptCache",
    "PromptRefused",
    "Usage",
    "count_tokens",
    "prompt_too_long",
]

Ttl = Literal["5m", "1h"]

DEFAULT_MIN_CACHEABLE_TOKENS = 1024
"""The API's shortest cacheable prefix for most models; shorter ones are not cached."""
LOOKBACK_BLOCKS = 20
"""How many block boundaries before a breakpoint the API also looks for a cached prefix."""
MAX_BREAKPOINTS = 4
"""The most ``cache_control`` blocks one request may carry."""

_TTL_SECONDS: dict[str, float] = {"5m": 300.0, "1h": 3600.0}
_CHARS_PER_TOKEN = 4
# Price of a token, in units of the input price.
_WRITE_5M_PRICE = 1.25
_WRITE_1H_PRICE = 2.0
_READ_PRICE = 0.1
# Blocks the API cannot put a breakpoint on, so the top-level cache_control skips them.
_UNCACHEABLE_TYPES = frozenset({"thinking", "redacted_thinking"})
# How many charges pass between sweeps of expired entries (keeps memory bounded without
# scanning the whole cache on every request).
_SWEEP_EVERY = 256


class PromptRefused(ValueError):
    """The API would refuse this request with a 400 ``invalid_request_error``; the
    message is the API's own."""


def prompt_too_long(tokens: int, window: int) -> str:
    """The API's message for a prompt past the context window."""
    return f"prompt is too long: {tokens} tokens > {window} maximum"


def count_tokens(request: Mapping[str, Any]) -> int:
    """The prompt's size in tokens, as the server counts it (at least 1).

    ``len(json.dumps(canonical)) // 4`` where ``canonical`` is the request's ``tools``,
    ``system`` and ``messages`` (those present, in that order), a string ``system`` or
    message ``content`` made a one-text-block list, each message only its ``role`` and
    ``content``, and every ``cache_control`` key left out."""
    return _Layout(request).total_tokens


@dataclass(frozen=True)
class Usage:
    """What one request's prompt was charged, in tokens: the uncached ``input_tokens``,
    the cache writes (split by TTL) and the cache reads."""

    input_tokens: int
    cache_read_input_tokens: int = 0
    ephemeral_5m_input_tokens: int = 0
    ephemeral_1h_input_tokens: int = 0

    @property
    def cache_creation_input_tokens(self) -> int:
        """Tokens written to the cache, both TTLs."""
        return self.ephemeral_5m_input_tokens + self.ephemeral_1h_input_tokens

    @property
    def prompt_tokens(self) -> int:
        """The whole prompt: input plus cache writes plus cache reads."""
        return self.input_tokens + self.cache_creation_input_tokens + self.cache_read_input_tokens

    @property
    def input_units(self) -> float:
        """The prompt's price in input-price units."""
        return (
            self.input_tokens
            + _WRITE_5M_PRICE * self.ephemeral_5m_input_tokens
            + _WRITE_1H_PRICE * self.ephemeral_1h_input_tokens
            + _READ_PRICE * self.cache_read_input_tokens
        )

    def as_api(self) -> dict[str, Any]:
        """The input half of the API's ``usage`` object (without ``output_tokens``)."""
        return {
            "input_tokens": self.input_tokens,
            "cache_creation_input_tokens": self.cache_creation_input_tokens,
            "cache_read_input_tokens": self.cache_read_input_tokens,
            "cache_creation": {
                "ephemeral_5m_input_tokens": self.ephemeral_5m_input_tokens,
                "ephemeral_1h_input_tokens": self.ephemeral_1h_input_tokens,
            },
        }


@dataclass(frozen=True)
class Bill:
    """What a server charged so far: sums over the requests it answered with a reply.

    ``input_units`` is the input side in input-price units (uncached input 1, 5m cache
    writes 1.25, 1h writes 2, reads 0.1); ``uncached_units`` is what the same prompts
    would have cost with no caching (their whole size)."""

    requests: int = 0
    input_tokens: int = 0
    cache_creation_input_tokens: int = 0
    cache_read_input_tokens: int = 0
    output_tokens: int = 0
    ephemeral_5m_input_tokens: int = 0
    ephemeral_1h_input_tokens: int = 0
    largest_prompt: int = 0
    """The largest prompt of one request, in tokens (input + cache writes + reads)."""

    @property
    def input_units(self) -> float:
        return (
            self.input_tokens
            + _WRITE_5M_PRICE * self.ephemeral_5m_input_tokens
            + _WRITE_1H_PRICE * self.ephemeral_1h_input_tokens
            + _READ_PRICE * self.cache_read_input_tokens
        )

    @property
    def uncached_units(self) -> int:
        return self.input_tokens + self.cache_creation_input_tokens + self.cache_read_input_tokens

    @property
    def billed_fraction(self) -> float:
        """``input_units / uncached_units`` (0.0 before any request): the share of the
        uncached price that was paid."""
        uncached = self.uncached_units
        return self.input_units / uncached if uncached else 0.0

    def plus(self, usage: Usage, output_tokens: int) -> Bill:
        """This bill with one more request added."""
        return Bill(
            requests=self.requests + 1,
            input_tokens=self.input_tokens + usage.input_tokens,
            cache_creation_input_tokens=(
                self.cache_creation_input_tokens + usage.cache_creation_input_tokens
            ),
            cache_read_input_tokens=self.cache_read_input_tokens + usage.cache_read_input_tokens,
            output_tokens=self.output_tokens + output_tokens,
            ephemeral_5m_input_tokens=(
                self.ephemeral_5m_input_tokens + usage.ephemeral_5m_input_tokens
            ),
            ephemeral_1h_input_tokens=(
                self.ephemeral_1h_input_tokens + usage.ephemeral_1h_input_tokens
            ),
            largest_prompt=max(self.largest_prompt, usage.prompt_tokens),
        )


@dataclass(frozen=True)
class _Breakpoint:
    block: int  # index of the marked block in the prompt's block order
    ttl: Ttl


@dataclass(frozen=True)
class _Prefix:
    tokens: int
    key: bytes


class Prompt:
    """One request read for caching: its size, its breakpoints and its prefixes.

    ``Prompt(request)`` raises :class:`PromptRefused` with the API's message when the
    breakpoints break the API's rules (a bad ``cache_control``, more than
    :data:`MAX_BREAKPOINTS`, a ``1h`` breakpoint after a ``5m`` one)."""

    def __init__(self, request: Mapping[str, Any]) -> None:
        layout = _Layout(request)
        self.total_tokens: int = layout.total_tokens
        self.breakpoints: tuple[_Breakpoint, ...] = layout.breakpoints()
        needed = {
            block
            for point in self.breakpoints
            for block in range(max(0, point.block - LOOKBACK_BLOCKS), point.block + 1)
        }
        self._prefixes = layout.prefixes(str(request.get("model", "")), needed)

    def prefix(self, block: int) -> _Prefix:
        """Token count and cache key of the prompt cut after ``block`` (one of the
        breakpoints' blocks or the 20 before each)."""
        return self._prefixes[block]


@dataclass
class _Entry:
    ttl: float
    expires: float


class PromptCache:
    """The API's prompt cache, priced: :meth:`charge` reads and writes it, :meth:`quote`
    only looks. Thread-safe.

    ``clock`` gives seconds (``time.monotonic`` by default); pass a fake one to let a
    test or benchmark jump past a TTL without waiting."""

    def __init__(
        self,
        *,
        min_cacheable_tokens: int = DEFAULT_MIN_CACHEABLE_TOKENS,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        if isinstance(min_cacheable_tokens, bool) or not isinstance(min_cacheable_tokens, int):
            raise TypeError(f"min_cacheable_tokens must be an int, got {min_cacheable_tokens!r}")
        if min_cacheable_tokens < 0:
            raise ValueError(f"min_cacheable_tokens must be >= 0, got {min_cacheable_tokens}")
        self.min_cacheable_tokens = min_cacheable_tokens
        self._clock = clock
        self._lock = threading.Lock()
        self._entries: dict[bytes, _Entry] = {}
        self._charges = 0

    def __len__(self) -> int:
        """Live entries."""
        with self._lock:
            now = self._clock()
            return sum(1 for entry in self._entries.values() if entry.expires > now)

    def quote(self, prompt: Prompt) -> Usage:
        """What :meth:`charge` would charge now, changing nothing."""
        with self._lock:
            return self._price(prompt, commit=False)

    def charge(self, prompt: Prompt) -> Usage:
        """Price the prompt and do what the API does: refresh what it read, write the
        breakpoints past it."""
        with self._lock:
            self._charges += 1
            if self._charges % _SWEEP_EVERY == 0:
                now = self._clock()
                self._entries = {k: e for k, e in self._entries.items() if e.expires > now}
            return self._price(prompt, commit=True)

    def _price(self, prompt: Prompt, *, commit: bool) -> Usage:
        now = self._clock()
        read_block = -1
        for point in prompt.breakpoints:
            # Walking back from the breakpoint, the first live entry is the longest for it.
            for block in range(point.block, max(-1, point.block - LOOKBACK_BLOCKS - 1), -1):
                if block <= read_block:
                    break
                if self._live(prompt.prefix(block).key, now) is not None:
                    read_block = block
                    break
        read_tokens = prompt.prefix(read_block).tokens if read_block >= 0 else 0
        written = {"5m": 0, "1h": 0}
        reached = read_tokens
        for point in prompt.breakpoints:
            prefix = prompt.prefix(point.block)
            if point.block <= read_block:
                # Covered by the read; keep its own entry alive too, if it has one.
                if commit:
                    self._refresh(prefix.key, now, _TTL_SECONDS[point.ttl])
                continue
            if prefix.tokens < self.min_cacheable_tokens:
                continue
            written[point.ttl] += max(0, prefix.tokens - reached)
            reached = max(reached, prefix.tokens)
            if commit:
                ttl = _TTL_SECONDS[point.ttl]
                self._entries[prefix.key] = _Entry(ttl=ttl, expires=now + ttl)
        if commit and read_block >= 0:
            self._refresh(prompt.prefix(read_block).key, now, 0.0)
        return Usage(
            input_tokens=max(0, prompt.total_tokens - reached),
            cache_read_input_tokens=read_tokens,
            ephemeral_5m_input_tokens=written["5m"],
            ephemeral_1h_input_tokens=written["1h"],
        )

    def _live(self, key: bytes, now: float) -> _Entry | None:
        entry = self._entries.get(key)
        return entry if entry is not None and entry.expires > now else None

    def _refresh(self, key: bytes, now: float, ttl: float) -> None:
        entry = self._live(key, now)
        if entry is not None:
            entry.ttl = max(entry.ttl, ttl)
            entry.expires = now + entry.ttl


# --- the prompt's canonical JSON, block by block ------------------------------------


@dataclass(slots=True)
class _Block:
    path: str  # where the API would name it in an error: "messages.3.content.0"
    end: int  # parts[:end] is the canonical JSON up to and including this block
    closers: str  # what closes that JSON into a whole object
    cache_control: object  # the block's cache_control, None when it has none
    cacheable: bool


@dataclass
class _Layout:
    """The canonical JSON of a request's prompt as parts, with where each block ends.

    ``"".join(parts)`` is ``json.dumps`` of the canonical prompt; a prefix ending at a
    block is ``parts[:end]`` plus its closers, itself the canonical JSON of the request
    cut after that block, so prefixes are counted exactly like whole prompts."""

    request: Mapping[str, Any]
    parts: list[str] = field(default_factory=list)
    blocks: list[_Block] = field(default_factory=list)

    def __post_init__(self) -> None:
        parts = self.parts
        parts.append("{")
        sections = [s for s in ("tools", "system", "messages") if self.request.get(s) is not None]
        for number, section in enumerate(sections):
            parts.append(("" if number == 0 else ", ") + json.dumps(section) + ": [")
            value = self.request[section]
            if section == "messages":
                for index, message in enumerate(_as_list(value)):
                    role = message.get("role") if isinstance(message, dict) else None
                    content = message.get("content") if isinstance(message, dict) else None
                    parts.append(("" if index == 0 else ", ") + '{"role": ')
                    parts.append(json.dumps(role) + ', "content": [')
                    self._add_blocks(_as_blocks(content), f"messages.{index}.content", "]}]}")
                    parts.append("]}")
            else:
                blocks = _as_blocks(value) if section == "system" else _as_list(value)
                self._add_blocks(blocks, section, "]}")
            parts.append("]")
        parts.append("}")

    def _add_blocks(self, blocks: Sequence[object], path: str, closers: str) -> None:
        # Request bodies are decoded JSON, so blocks are plain dicts (checked as such: an
        # isinstance against Mapping costs more than the rest of this loop).
        parts, dumps = self.parts, json.dumps
        for index, block in enumerate(blocks):
            fields: dict[str, Any] = block if isinstance(block, dict) else {}
            cache_control = fields.get("cache_control")
            parts.append(("" if index == 0 else ", ") + dumps(_uncontrolled(block)))
            self.blocks.append(
                _Block(
                    path=f"{path}.{index}",
                    end=len(parts),
                    closers=closers,
                    cache_control=cache_control,
                    cacheable=fields.get("type") not in _UNCACHEABLE_TYPES,
                )
            )

    @property
    def total_tokens(self) -> int:
        return max(1, sum(len(part) for part in self.parts) // _CHARS_PER_TOKEN)

    def breakpoints(self) -> tuple[_Breakpoint, ...]:
        marked: list[tuple[int, str, Ttl]] = []
        for index, block in enumerate(self.blocks):
            if block.cache_control is not None:
                marked.append((index, block.path, _ttl(block.cache_control, block.path)))
        top = self.request.get("cache_control")
        if top is not None:
            ttl = _ttl(top, "")
            last = next(
                (i for i in range(len(self.blocks) - 1, -1, -1) if self.blocks[i].cacheable),
                None,
            )
            # On a block that already has its own breakpoint it adds nothing.
            if last is not None and all(index != last for index, _, _ in marked):
                marked.append((last, self.blocks[last].path, ttl))
                marked.sort()
        if len(marked) > MAX_BREAKPOINTS:
            raise PromptRefused(
                f"A maximum of {MAX_BREAKPOINTS} blocks with cache_control may be provided. "
                f"Found {len(marked)}."
            )
        seen_5m = False
        for _, path, ttl in marked:
            if ttl == "1h" and seen_5m:
                raise PromptRefused(
                    f"{path}.cache_control.ttl: a ttl='1h' cache_control block must not come "
                    "after a ttl='5m' cache_control block. Note that blocks are processed in "
                    "the following order: `tools`, `system`, `messages`."
                )
            seen_5m = seen_5m or ttl == "5m"
        return tuple(_Breakpoint(block=index, ttl=ttl) for index, _, ttl in marked)

    def prefixes(self, model: str, needed: set[int]) -> dict[int, _Prefix]:
        if not needed:
            return {}
        # One running hash over the parts; each needed prefix is a copy closed off.
        running = hashlib.sha256(model.encode("utf-8") + b"\0")
        length = 0
        fed = 0
        prefixes: dict[int, _Prefix] = {}
        for index in sorted(needed):
            block = self.blocks[index]
            text = "".join(self.parts[fed : block.end])
            running.update(text.encode("utf-8"))
            length += len(text)
            fed = block.end
            closed = running.copy()
            closed.update(block.closers.encode("utf-8"))
            prefixes[index] = _Prefix(
                tokens=(length + len(block.closers)) // _CHARS_PER_TOKEN,
                key=closed.digest()[:16],
            )
        return prefixes


def _ttl(cache_control: object, path: str) -> Ttl:
    where = f"{path}.cache_control" if path else "cache_control"
    if not isinstance(cache_control, Mapping) or cache_control.get("type") != "ephemeral":
        raise PromptRefused(f"{where}.type: Input should be 'ephemeral'")
    ttl = cache_control.get("ttl", "5m")
    if ttl == "5m":
        return "5m"
    if ttl == "1h":
        return "1h"
    raise PromptRefused(f"{where}.ttl: Input should be '5m' or '1h'")


def _as_list(value: object) -> list[object]:
    return list(value) if isinstance(value, list | tuple) else []


def _as_blocks(content: object) -> list[object]:
    if isinstance(content, str):
        return [{"type": "text", "text": content}]
    return _as_list(content)


def _uncontrolled(block: object) -> object:
    """The block without ``cache_control`` (also inside a tool result's content)."""
    if not isinstance(block, dict):
        return block
    bare = {k: v for k, v in block.items() if k != "cache_control"}
    if block.get("type") == "tool_result" and isinstance(bare.get("content"), list):
        bare["content"] = [_uncontrolled(inner) for inner in bare["content"]]
    return bare
