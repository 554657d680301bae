"""Test and demo helpers: a scripted model that speaks the Anthropic Messages API.

Point the real ``anthropic`` client at a :class:`ModelServer` and script its answers::

    from alpineagents.testing import ModelServer, error, reply, tool_use

    with ModelServer([reply("Let me look.", tool_use("ls", {"path": "."})),
                      error(529),
                      reply("All done.")]) as model:
        client = anthropic.Anthropic(base_url=model.url, api_key="test")

From a shell: ``python -m alpineagents.testing serve --port 0 --script turns.json``
(or ``--echo``) prints the server's URL on its first line.

The kit, by module: :mod:`.script` (the turns and script files), :mod:`.echo` (the echo
model), :mod:`.server` (:class:`ModelServer`), :mod:`.billing` (what the server charges:
prompt caching, the context window, :class:`Bill`), :mod:`.rate_limits` (the API's rate
limits, :class:`RateLimits`), :mod:`.memory_store` (:class:`MemoryStore`,
the spec's store of your own) and :mod:`.conformance` (the store conformance suite, to
run on your own store; it needs pytest, so import it from there).
"""

from .billing import Bill
from .echo import echo_reply
from .memory_store import MemoryStore
from .rate_limits import RateLimits
from .script import (
    Drop,
    Failure,
    Hold,
    Reply,
    StopReason,
    ToolUse,
    Turn,
    drop,
    error,
    hold,
    load_script,
    parse_script,
    reply,
    tool_use,
)
from .server import ModelServer, RecordedRequest

__all__ = [
    "Bill",
    "Drop",
    "Failure",
    "Hold",
    "MemoryStore",
    "ModelServer",
    "RateLimits",
    "RecordedRequest",
    "Reply",
    "StopReason",
    "ToolUse",
    "Turn",
    "drop",
    "echo_reply",
    "error",
    "hold",
    "load_script",
    "parse_script",
    "reply",
    "tool_use",
]
