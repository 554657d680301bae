"""The Agent: runs a State with a model and tools, saving its history as it goes."""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import json
from collections.abc import Callable, Iterable
from typing import Any

from . import model as _model
from . import tracing
from .context import (
    TOKENS_PER_CHAR,
    Compaction,
    check_cache_ttl,
    compaction_cut,
    oversized_results,
    window_for,
    with_cache_breakpoints,
)
from .interrupts import SignalsStopTheRun
from .messages import Message, excerpt
from .model_requests import (
    RunClient,
    made_client,
    messages_request,
    next_request,
    reply_cost,
    too_long_error,
    usage_of,
)
from .pacing import Pacer, Throttle
from .permissions import AskPerson, Policy, allow_all
from .providers import Provider
from .run_hold import RunHold, to_the_end
from .state import State, StopReason, ToolCall, cleared_text, error_text
from .store.base import Store, check_owner
from .tool_calls import call_tools, current_call, permit
from .tools import Tool, as_tool
from .toolsets import Toolset
from .usage import Budget, CacheTTL, Price

# The model client of the run in this context: an async client belongs to one event loop.
_run_client: contextvars.ContextVar[Any] = contextvars.ContextVar("run_client")
_INTERRUPTS = (KeyboardInterrupt, SystemExit, asyncio.CancelledError, GeneratorExit)
# Requests refused as too long in a row before the run fails: each must be smaller than
# the one before, and a compaction that cannot get there ends the run with one error.
_MAX_REFUSED_IN_A_ROW = 3
_SUMMARY_ASK = (
    "Summarize the conversation so far in a few paragraphs for yourself to continue from: "
    "keep the task, every fact, decision, result and open question needed to finish it. "
    "Answer with the summary as text only; do not call any tool."
)


class Agent:
    """Runs States with a Claude model and tools, saving each step to ``store``.

    ``run(state)`` (or ``await arun(state)``) loops over the steps ``think``,
    ``use_tools`` and ``compact`` until the model answers, and returns the answer.
    ``tools`` takes tools and toolsets (``alpineagents.mcp.MCPServer``); a toolset's
    tools are listed when a run first needs them and kept for the whole run.

    Long runs: ``prompt_cache`` (``"5m"``, ``"1h"`` or ``None``) marks cache breakpoints
    on every request; ``compaction`` keeps requests inside ``context_window`` (the
    model's, from :data:`alpineagents.context.WINDOWS`, unless given); ``budget`` stops
    the run ``budget_exceeded`` at a limit; ``prices`` overrides the price table the
    estimated cost (``state.cost_usd``) is computed with.

    A fleet on one key: each model request waits for its turn from ``pacer`` (by default
    one per process and key, pacing by the provider's headers; a
    :class:`~alpineagents.pacing.SharedPacer` asks the fleet's limiter). A 429 or 529 is a
    wait, never a failed step; ``on_throttle(state, throttle)`` is told of each wait.

    ``provider`` (:class:`~alpineagents.providers.Provider`) says where requests go: the
    Anthropic API (the default, or a gateway), Bedrock, Vertex AI or Foundry. A ``client``
    given is used as it is.
    """

    def __init__(
        self,
        model: str,
        store: Store | None = None,
        *,
        tools: Iterable[Tool | Toolset | Callable[..., Any]] = (),
        system: str | None = None,
        max_tokens: int = 8192,
        max_turns: int | None = None,
        permissions: Policy | None = None,
        ask: AskPerson | None = None,
        client: Any = None,
        retry: _model.Retry | None = None,
        prompt_cache: CacheTTL | None = "5m",
        context_window: int | None = None,
        compaction: Compaction | None = Compaction(),  # noqa: B008 - frozen, shared safely
        budget: Budget | None = None,
        prices: dict[str, Price] | None = None,
        pacer: Pacer | None = None,
        on_throttle: Callable[[State, Throttle], None] | None = None,
        provider: Provider | None = None,
    ) -> None:
        self.model = model
        self.store = store
        given = list(tools)
        self.toolsets = [t for t in given if isinstance(t, Toolset)]
        self.tools = {
            t.name: t for t in map(as_tool, (t for t in given if not isinstance(t, Toolset)))
        }
        self.system = system
        self.max_tokens = max_tokens
        self.max_turns = max_turns
        self.permissions = permissions or allow_all
        self.ask = ask
        self.prompt_cache = check_cache_ttl(prompt_cache)
        if context_window is not None:
            window_for(model, context_window)  # checked now; the model may change later
        self.context_window = context_window
        self.compaction = compaction
        self.budget = budget
        self.prices = prices
        self.retry = retry or _model.Retry()
        self.pacer = pacer
        self.on_throttle = on_throttle
        self.provider = provider
        self._client = client

    # ------------------------------------------------------------------ running
    def run(self, state: State) -> str | None:
        """Run ``state`` until the model answers; return the answer.

        Returns ``None`` when the run stops without an answer (``state.stopped`` says
        why: ``"max_turns"`` or ``"waiting_for_approval"``). Any exception ends the run
        the usual way: calls without a result are closed and the State is saved. Ctrl+C,
        or an exception raised by a SIGTERM handler, is taken at the run's next step
        (never in the middle of a save) and raised once the State is saved.
        """
        loop: asyncio.AbstractEventLoop | None = None
        task: asyncio.Task[str | None] | None = None
        hold: RunHold | None = None
        stop: SignalsStopTheRun | None = None
        try:  # from the first line on: a Ctrl+C before the handlers are in place is caught below
            hold = self._hold(state, sync_saves=True)
            stop = SignalsStopTheRun(hold)
            with stop:
                self._refuse_sync_run()
                loop = asyncio.new_event_loop()
                task = loop.create_task(self._run(state, hold))
                stop.cancels(loop, task)
                answer = loop.run_until_complete(task)
        except BaseException as error:
            if task is None or not task.done():
                if not isinstance(error, _INTERRUPTS):
                    raise
                # Raised outside the run's steps (before they began, or by a signal handler
                # while the loop waited): the steps close the calls with it, save, and end.
                hold = hold or self._hold(state, sync_saves=True)
                hold.interrupt = error
                loop = loop or asyncio.new_event_loop()
                task = task or loop.create_task(self._run(state, hold))
                loop.call_soon(task.cancel)  # after the task's first step, so that it runs
                with contextlib.suppress(BaseException):
                    loop.run_until_complete(task)
                raise
            if stop is not None and stop.raised is not None:
                raise stop.raised from None
            raise
        finally:
            if loop is not None:
                loop.close()
        if stop.raised is not None:
            raise stop.raised  # it came after the run's last step: the State is saved
        return answer

    async def arun(self, state: State) -> str | None:
        """Async ``run``. Cancel the task to stop it: calls are closed and the State is saved."""
        return await self._run(state, self._hold(state, sync_saves=False))

    async def _run(self, state: State, hold: RunHold) -> str | None:
        check_owner(self.store, state)
        if not state.history:
            raise ValueError(f"State {state.id!r} has no messages: give it a first message")
        if state.active_run is not None:
            raise RuntimeError(f"State {state.id!r} is already running")
        hold.loop = asyncio.get_running_loop()
        state.active_run = hold
        client_token: contextvars.Token[Any] | None = None
        try:
            try:
                # Inside the guard, like every instant of the run: building the client,
                # the first save (which refuses a new State whose id is taken), the steps.
                # The client is made on first use: a resumed run saves before the SDK loads.
                client_token = _run_client.set(RunClient(self._client, self.provider))
                await self._save(state)
                tracing.begin_attempt(
                    state, self.model, self._gen_ai_provider()
                )  # after the save: loads the SDK
                stopped = await self._steps(state)
                if state.stopped != stopped:
                    state.add("stop", f"stopped: {stopped}", {"reason": stopped})
            except BaseException as error:
                if error is hold.save_error and not state.saved_entries:
                    raise  # the store refused the new State: nothing of it is saved to close
                reason = hold.interrupt or error
                state.close_open_turn(reason)
                kind: StopReason = "interrupted" if isinstance(reason, _INTERRUPTS) else "error"
                state.add(
                    "stop",
                    f"stopped: {error_text(reason)}",
                    {"reason": kind, "error": error_text(reason)},
                )
                try:
                    await self._save(state)
                except Exception as save_error:
                    if reason is not hold.save_error:
                        reason.add_note(f"saving the state also failed: {error_text(save_error)}")
                raise
            await self._save(state)  # run ends
            return state.answer
        finally:
            await self._end(state, hold, client_token)

    async def _end(
        self, state: State, hold: RunHold, client_token: contextvars.Token[Any] | None
    ) -> None:
        """After a run: save what was sent after its last save, wake every sender, close."""
        state.active_run = None
        try:
            if hold.unsaved_sends():
                with contextlib.suppress(Exception):  # the senders get the error
                    await self._save(state)
        finally:
            tracing.end_attempt(state)
            hold.end()
            await hold.toolsets.aclose()
            if client_token is not None:
                client = _run_client.get()
                _run_client.reset(client_token)
                await client.close()

    async def _steps(self, state: State) -> StopReason:
        turns = 0
        refused: list[int] = []  # sizes of the requests refused as too long, in a row
        while True:
            runnable = [c for c in state.pending_calls if c not in state.awaiting_approval]
            if runnable or (state.pending_calls and self.ask is not None):
                await self.use_tools(state)
                continue
            if state.pending_calls:
                return "waiting_for_approval"
            state.join_waiting()
            if not state.messages or state.messages[-1].role != "user":
                return "answered"
            if self.max_turns is not None and turns >= self.max_turns:
                return "max_turns"
            if self._over_budget(state):
                return "budget_exceeded"
            await self.compact(state)
            try:
                await self.think(state)
            except Exception as error:
                too_long = too_long_error(error)
                if too_long is None or self.compaction is None:
                    raise
                if len(refused) >= _MAX_REFUSED_IN_A_ROW or (refused and too_long >= refused[-1]):
                    error.add_note(
                        f"compacting did not bring the request inside the model's window "
                        f"({', '.join(map(str, [*refused, too_long]))} tokens, refused in a row)"
                    )
                    raise
                refused.append(too_long)
                if not await self.compact(state, too_long=too_long):
                    raise  # nothing left to compact: the run cannot go on
                continue
            refused.clear()
            turns += 1

    def _over_budget(self, state: State) -> bool:
        """Whether the run is at a limit of its budget (saved as a ``stop`` entry saying which)."""
        if self.budget is None:
            return False
        why = self.budget.exceeded(state.usage, state.cost_usd)
        if why is None:
            return False
        if state.stopped != "budget_exceeded":
            state.add("stop", f"stopped: {why}", {"reason": "budget_exceeded", "error": why})
        return True

    # ------------------------------------------------------------------ steps
    async def think(self, state: State) -> Message:
        """Ask the model for its next message, saving before and after."""
        request, chars = next_request(self, state, await self._tools(state))
        state.add(
            "model_request",
            f"asking {self.model}",
            {"model": self.model, "prompt_chars": chars, **tracing.request_context()},
        )
        await self._save(state)
        try:
            reply = await tracing.chat(request, self._ask(state, request, chars))
        except Exception as error:
            # Taken back: the messages stay as they were, so the next think asks again.
            state.add("model_error", error_text(error), {"error": error_text(error)}, error)
            state.join_waiting()
            raise
        message = Message.assistant(reply.get("content", []))
        calls = ", ".join(b["name"] for b in message.tool_uses)
        model = reply.get("model", self.model)
        state.add(
            "model_reply",
            f"{self.model} calls {calls}" if calls else f"{self.model}: {excerpt(message.text)}",
            {
                "message": message.to_dict(),
                "model": model,
                "stop_reason": reply.get("stop_reason"),
                "usage": usage_of(reply),
                "cost_usd": reply_cost(self, model, reply),
            },
        )
        if not calls:
            state.join_waiting()
        await self._save(state)
        return message

    async def use_tools(self, state: State) -> None:
        """Run the pending tool calls concurrently, saving each result the moment it arrives."""
        runnable: list[tuple[ToolCall, Tool]] = []
        tools = await self._tools(state)
        for pending in state.pending_calls:
            tool = tools.get(pending.name)
            if tool is None:
                known = ", ".join(sorted(tools)) or "none"
                state.add_result(
                    pending, "error", f"(unknown tool {pending.name!r}; tools: {known})"
                )
                continue
            allowed = await permit(state, pending, self.permissions, self.ask)
            if allowed:
                runnable.append((pending, tool))
                if state.approval(pending.id) is not None:
                    state.mark_started(pending)  # from here on it may have run
            elif allowed is False:
                state.add_result(
                    pending, "refused", "(refused: the permission check did not allow this call)"
                )
        await self._save(state)  # refusals, answers and starts are saved before any tool runs
        await call_tools(state, runnable, self._save)
        if not state.pending_calls:
            state.join_waiting()
        await self._save(state)

    async def compact(self, state: State, *, too_long: int | None = None) -> bool:
        """Keep the next request inside the context window; return whether it changed.

        Past ``compaction.trigger`` of the window (or when the API refused the last
        request as ``too_long`` tokens), first clear older tool results from the
        requests, then, if still above ``compaction.target``, replace older turns by a
        summary the model writes. Each step is saved before any request uses it.
        """
        policy = self.compaction
        if policy is None:
            return False
        window = window_for(self.model, self.context_window)
        tools = await self._tools(state)
        _, chars = next_request(self, state, tools, marked=False)
        ratio = too_long / chars if too_long else state.tokens_per_char or TOKENS_PER_CHAR
        estimate = chars * ratio

        def over(estimate: float) -> bool:
            return estimate > window * policy.trigger or estimate + self.max_tokens > window

        async def cleared(text: str, data: dict[str, Any]) -> float:
            """Save a ``cleared`` entry; the next request's estimate with it."""
            state.add("cleared", text, {**data, "tokens": round(estimate)})
            await self._save(state)
            _, chars = next_request(self, state, tools, marked=False)
            return chars * ratio

        if too_long is None and not over(estimate):
            return False
        target, changed = window * policy.target, False
        # Summarize only when clearing cannot reach the target: it keeps more of the run.
        exhausted = True
        if policy.clear_results:
            results = state.clearable_results()
            older = results[: max(0, len(results) - policy.keep_results)]
            through, saved = -1, 0
            for seq, size in older:
                if estimate - saved * ratio <= target:
                    exhausted = False
                    break
                through, saved = seq, saved + size - len(json.dumps(cleared_text(seq)))
            if through >= 0:
                count = sum(1 for seq, _ in older if seq <= through)
                estimate = await cleared(
                    f"cleared {count} older tool results from the requests",
                    {"through_seq": through, "results": count},
                )
                changed = True
        cuts = oversized_results(state.clearable_results(), window, ratio) if over(estimate) else []
        if cuts:
            # A result no clearing or summary can make room for (it is among the newest):
            # the requests carry its start and where the rest is; the history keeps it all.
            estimate = await cleared(
                f"cut {len(cuts)} tool results too large for the context window",
                {"through_seq": -1, "results": 0, "cut": cuts},
            )
            changed = True
        if policy.summarize and estimate > target and (exhausted or over(estimate)):
            changed = await self._summarize(state, tools, policy, window, ratio) or changed
        return changed

    async def _summarize(
        self,
        state: State,
        tools: dict[str, Tool],
        policy: Compaction,
        window: int,
        ratio: float,
    ) -> bool:
        """Replace the turns before the last ``policy.keep_turns`` by a model-written summary."""
        cut = compaction_cut(state.messages, policy.keep_turns)
        if cut < 1:
            return False
        ask = {"type": "text", "text": _SUMMARY_ASK}
        request, chars = next_request(self, state, tools, marked=False)
        if chars * ratio + self.max_tokens > window:
            # The whole conversation does not fit: summarize the part that is replaced.
            request = messages_request(self, state.messages[:cut], tools)
        messages = list(request["messages"])
        last = messages[-1]
        if last["role"] == "user":
            messages[-1] = {"role": "user", "content": [*last["content"], ask]}
        else:
            messages.append({"role": "user", "content": [ask]})
        request = {**request, "messages": messages}
        if self.prompt_cache is not None:
            request = with_cache_breakpoints(request, self.prompt_cache)
        reply = await tracing.chat(request, self._ask(state, request))
        summary = Message.assistant(reply.get("content", [])).text.strip()
        if not summary and "tools" in request:
            # It called a tool instead: ask once more with tools off (this request alone
            # misses the cache, as a changed tool_choice does).
            request = {**request, "tool_choice": {"type": "none"}}
            reply = await self._ask(state, request)
            summary = Message.assistant(reply.get("content", [])).text.strip()
        if not summary:
            raise RuntimeError(
                "the model wrote no summary for the compaction: nothing was replaced"
            )
        state.add(
            "compaction",
            f"compacted {cut} messages",
            {
                "summary": summary,
                "replaced": cut,
                "usage": usage_of(reply),
                "cost_usd": reply_cost(self, reply.get("model", self.model), reply),
            },
        )
        await self._save(state)
        return True

    def as_tool(self, name: str, description: str) -> Tool:
        """This agent as a tool of another: each call runs a subagent saved as its own State."""

        async def run_subagent(task: str) -> str:
            parent, call_id = current_call.get()
            child_id = f"{parent.id}.{call_id}"
            store = self.store
            child: State | None = None
            if store is not None:
                with contextlib.suppress(LookupError):
                    child = await store.aload(child_id)
            if child is None:
                child = State(child_id, [Message.user(task)], parent_id=parent.id)
            answer = await self.arun(child)
            return answer if answer is not None else f"(the subagent stopped: {child.stopped})"

        schema = {
            "type": "object",
            "properties": {
                "task": {"type": "string", "description": "What the subagent should do"}
            },
            "required": ["task"],
        }
        return Tool(name, description, schema, run_subagent)

    # ------------------------------------------------------------------ internals
    def _refuse_sync_run(self) -> None:
        if self.store is not None and self.store.is_async_only:
            raise TypeError(
                f"{type(self.store).__name__} is async-only: run this Agent with "
                f"'await agent.arun(state)'"
            )
        try:
            asyncio.get_running_loop()
        except RuntimeError:
            pass
        else:
            raise RuntimeError(
                "Agent.run() cannot be called from async code: use 'await agent.arun(state)'"
            )

    async def _save(self, state: State) -> None:
        if self.store is None:
            return
        hold = state.active_run
        if not isinstance(hold, RunHold):  # a step called outside a run, or the run's end
            await self.store.asave(state)
            return
        try:
            if hold.sync_saves:
                self.store.save(state)
            else:
                await to_the_end(self._locked_asave(state, hold))
        except Exception as error:
            hold.save_error = error
            hold.settle_sends(error)
            raise
        hold.settle_sends()

    async def _locked_asave(self, state: State, hold: RunHold) -> None:
        assert self.store is not None
        async with hold.save_lock:
            await self.store.asave(state)

    def _save_soon(self, state: State, hold: RunHold) -> None:
        async def save() -> None:
            with contextlib.suppress(Exception):  # the next step's save raises it
                await self._save(state)

        if state.active_run is hold:
            hold.background.add(task := asyncio.ensure_future(save()))
            task.add_done_callback(hold.background.discard)

    async def _tools(self, state: State) -> dict[str, Tool]:
        """The run's tools: this agent's own, plus its toolsets' (opened on first use in a run)."""
        if not self.toolsets:
            return self.tools
        hold = state.active_run
        if not isinstance(hold, RunHold) or hold.agent is not self:
            raise RuntimeError(
                "this Agent's toolsets (MCP servers) are open only while it runs: call "
                "run(state) or arun(state) rather than think or use_tools on their own"
            )
        return await hold.toolsets.tools(state, self.tools)

    async def _ask(
        self, state: State, request: dict[str, Any], prompt_chars: int | None = None
    ) -> dict[str, Any]:
        def report(throttle: Throttle) -> None:
            tracing.throttled(throttle)
            if self.on_throttle is not None:
                self.on_throttle(state, throttle)

        secrets = self.provider.secrets() if self.provider is not None else ()
        client = self._model_client()
        return await _model.ask(
            client, request, self.retry, self.pacer, report, secrets, prompt_chars=prompt_chars
        )

    def _model_client(self) -> Any:
        run = _run_client.get(None)
        return run.get() if run is not None else self._client or made_client(self.provider)

    def _gen_ai_provider(self) -> str:
        return self.provider.gen_ai_name if self.provider is not None else tracing.PROVIDER

    def _hold(self, state: State, *, sync_saves: bool) -> RunHold:
        return RunHold(self, state, sync_saves=sync_saves, save_soon=self._save_soon)
