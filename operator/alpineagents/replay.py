"""The views a State derives from its history (``messages``, ``answer``, pending tool
calls, ``stopped``, usage and cost, ...), and :meth:`HistoryViews._replay`, the one
function that applies an entry to them, whether the entry was just made by a live run or
read back from a store. :class:`~alpineagents.state.State` is built on it."""

from __future__ import annotations

import json
from typing import Any, cast

from .history import Entry, StopReason, ToolCall, ToolList, cleared_text, cut_text
from .messages import Message
from .usage import USAGE_KEYS
from .usage import prompt_tokens as _prompt_tokens

__all__ = ["HistoryViews"]


class HistoryViews:
    """What a history says, kept up to date entry by entry by :meth:`_replay` (the only
    place that derives it). A State is one; it appends the entries."""

    def __init__(self) -> None:
        self.messages: list[Message] = []
        self.stopped: StopReason | None = None
        self.turns = 0
        self.usage: dict[str, int] = dict.fromkeys(USAGE_KEYS, 0)
        self.cost_usd = 0.0
        """The estimated cost of every reply so far (each reply's is saved with it)."""
        self.prompt_tokens = 0
        """The size in tokens of the last request the model answered (its whole prompt)."""
        self.tokens_per_char = 0.0
        """Tokens per character of request JSON, as the last reply measured it (0: not yet)."""
        self.context_edits = 0
        """How many ``cleared`` and ``compaction`` entries changed ``messages`` in place."""
        self.tool_lists: dict[str, ToolList] = {}
        """What each toolset (an MCP server) listed, from the history's ``tools`` entries."""
        # Derived bookkeeping of the open turn.
        self._calls: dict[str, ToolCall] = {}
        self._results: dict[str, Entry] = {}
        self._asked: set[str] = set()
        self._answered: dict[str, bool] = {}
        # Calls a person answered whose runs mark when they take them (``started``
        # entries), and the calls they took: an answered call not taken never ran.
        self._marked: set[str] = set()
        self._started: set[str] = set()
        self._request_open = False
        self._request_chars = 0
        self._result_seqs: dict[str, int] = {}
        self._cleared_through = -1
        self._uncleared = 0  # the first message that may hold a result not cleared yet
        self._waiting: list[tuple[int, Message]] = []

    # ----------------------------------------------------------------- derived views
    @property
    def answer(self) -> str | None:
        """The model's final reply, or ``None`` while the run has more to do."""
        if self.messages and self.messages[-1].role == "assistant":
            last = self.messages[-1]
            if not last.tool_uses:
                return last.text
        return None

    @property
    def pending_calls(self) -> list[ToolCall]:
        """Tool calls of the open turn that have no result yet, in the model's order."""
        return [c for c in self._calls.values() if c.id not in self._results]

    @property
    def awaiting_approval(self) -> list[ToolCall]:
        """Calls a person was asked about and has not answered."""
        return [c for c in self.pending_calls if c.id in self._asked and c.id not in self._answered]

    @property
    def waiting(self) -> list[Message]:
        """Messages sent while a turn was open, that join ``messages`` when it closes."""
        return [m for _, m in self._waiting]

    def approval(self, call_id: str) -> bool | None:
        return self._answered.get(call_id)

    def _never_started(self, call_id: str) -> bool:
        """True for a call that certainly did not run: waiting for a person, or answered
        by one and not taken by a run since. Histories from before ``started`` entries
        say nothing of this, so their answered calls may have run."""
        if call_id not in self._asked:
            return False
        return call_id not in self._answered or (
            call_id in self._marked and call_id not in self._started
        )

    def _replay(self, entry: Entry) -> None:
        """Apply one entry to the derived views. The only place that derives them."""
        kind, data = entry.kind, entry.data
        if kind != "stop":
            self.stopped = None
        if kind == "message":
            self.messages.append(Message.from_dict(data["message"]))
        elif kind == "waiting":
            self._waiting.append((entry.seq, Message.from_dict(data["message"])))
        elif kind == "joined":
            for index, (seq, message) in enumerate(self._waiting):
                if seq == data["waiting_seq"]:
                    del self._waiting[index]
                    self.messages.append(message)
                    break
        elif kind == "model_request":
            self._request_open = True
            self._request_chars = int(data.get("prompt_chars", 0))
        elif kind == "model_error":
            self._request_open = False
        elif kind == "model_reply":
            self._request_open = False
            self.turns += 1
            usage = data.get("usage", {})
            for key in USAGE_KEYS:
                self.usage[key] += int(usage.get(key, 0))
            self.cost_usd += float(data.get("cost_usd", 0.0))
            self.prompt_tokens = _prompt_tokens(usage)
            if self._request_chars and self.prompt_tokens:
                self.tokens_per_char = self.prompt_tokens / self._request_chars
            reply = Message.from_dict(data["message"])
            self.messages.append(reply)
            self._calls = {
                b["id"]: ToolCall(b["id"], b["name"], dict(b.get("input") or {}))
                for b in reply.tool_uses
            }
            self._results, self._asked, self._answered = {}, set(), {}
            self._marked, self._started = set(), set()
        elif kind == "approval_request":
            self._asked.add(data["call_id"])
        elif kind == "permission":
            if data.get("by") == "person":
                self._answered[data["call_id"]] = bool(data["allow"])
                if data.get("marks_start"):
                    self._marked.add(data["call_id"])
        elif kind == "started":
            self._started.add(data["call_id"])
        elif kind == "tool_result":
            self._results[data["call_id"]] = entry
            self._result_seqs[data["call_id"]] = entry.seq
            if self._calls and all(call_id in self._results for call_id in self._calls):
                self.messages.append(Message.user(self._result_blocks()))
                self._calls = {}
        elif kind == "compaction":
            summary = Message.user(f"Summary of the earlier conversation:\n{data['summary']}")
            # The summary's own request counts, like a reply's (older entries have none).
            for key, value in data.get("usage", {}).items():
                if key in self.usage:
                    self.usage[key] += int(value)
            self.cost_usd += float(data.get("cost_usd", 0.0))
            replaced = int(data["replaced"])
            self.messages[:replaced] = [summary]
            self._uncleared = max(1, self._uncleared - replaced + 1)
            self.context_edits += 1
        elif kind == "cleared":
            self._clear_results(int(data["through_seq"]))
            # Results too large for the window, cut in the requests (older readers, which
            # know no "cut", send them whole: the history is the same either way).
            for seq, keep in data.get("cut", ()):
                self._cut_result(int(seq), int(keep))
            self.context_edits += 1
        elif kind == "stop":
            self.stopped = cast(StopReason, str(data["reason"]))
        elif kind == "tools":
            listed = list(data["tools"])
            known = self.tool_lists.get(data["source"])
            self.tool_lists[data["source"]] = ToolList(known.started if known else listed, listed)

    def _clear_results(self, through_seq: int) -> None:
        """Put placeholders for the results saved at or before ``through_seq`` in
        ``messages`` (the history keeps them whole)."""
        seqs = self._result_seqs
        for index in range(self._uncleared, len(self.messages)):
            message = self.messages[index]
            if message.role == "user" and not isinstance(message.content, str):
                blocks, newer = [], False
                for block in message.content:
                    seq = seqs.get(block.get("tool_use_id", ""))
                    if block.get("type") == "tool_result" and seq is not None:
                        if seq > through_seq:
                            newer = True
                        else:
                            block = {**block, "content": cleared_text(seq)}
                    blocks.append(block)
                if blocks != message.content:
                    self.messages[index] = Message.user(blocks)
                if newer:
                    return  # the results from here on are newer
            self._uncleared = index + 1

    def _cut_result(self, seq: int, keep: int) -> None:
        """Put :func:`cut_text` for the result saved at ``seq`` in ``messages``."""
        seqs = self._result_seqs
        for index in range(self._uncleared, len(self.messages)):
            message = self.messages[index]
            if message.role != "user" or isinstance(message.content, str):
                continue
            blocks = [
                {**block, "content": cut_text(block.get("content", ""), keep, seq)}
                if block.get("type") == "tool_result"
                and seqs.get(block.get("tool_use_id", "")) == seq
                else block
                for block in message.content
            ]
            if blocks != message.content:
                self.messages[index] = Message.user(blocks)
                return

    def clearable_results(self) -> list[tuple[int, int]]:
        """The results in ``messages`` not cleared yet, oldest first: (seq, characters)."""
        seqs, found = self._result_seqs, []
        for message in self.messages[self._uncleared :]:
            if message.role != "user" or isinstance(message.content, str):
                continue
            for block in message.content:
                seq = seqs.get(block.get("tool_use_id", ""))
                if block.get("type") == "tool_result" and seq is not None:
                    content = block.get("content", "")
                    if content != cleared_text(seq):
                        found.append((seq, len(json.dumps(content))))
        return found

    def _result_blocks(self) -> list[dict[str, Any]]:
        blocks = []
        for call_id in self._calls:
            result = self._results[call_id].data
            block: dict[str, Any] = {
                "type": "tool_result",
                "tool_use_id": call_id,
                "content": result["content"],
            }
            if result["outcome"] != "ok":
                block["is_error"] = True
            blocks.append(block)
        return blocks
