"""Test and demo helpers: a scripted model that speaks the Anthropic Messages API.

Point the real ``anthropic`` client at a :class:`ModelServer` and script its answers::

    from alpineagents.testing import ModelServer, error, reply, tool_use

    with ModelServer([reply("Let me look.", tool_use("ls", {"path": "."})),
                      error(529),
                      reply("All done.")]) as model:
        client = anthropic.Anthropic(base_url=model.url, api_key="test")

From a shell: ``python -m alpineagents.testing serve --port 0 --script turns.json``
(or ``--echo``) prints the server's URL on its first line.
"""

from .model_server import (
    Drop,
    Failure,
    Hold,
    ModelServer,
    RecordedRequest,
    Reply,
    StopReason,
    ToolUse,
    Turn,
    drop,
    echo_reply,
    error,
    hold,
    load_script,
    parse_script,
    reply,
    tool_use,
)

__all__ = [
    "Drop",
    "Failure",
    "Hold",
    "ModelServer",
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
