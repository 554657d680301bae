"""A step's tool calls, run: concurrently, each async tool on the run's loop and each plain
function on a daemon thread of its own, the call running in a context known to subagents
(:data:`current_call`)."""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import inspect
import json
import threading
from collections.abc import Awaitable, Callable
from typing import Any

from . import tracing
from .messages import excerpt
from .permissions import AskPerson, Policy
from .state import State, ToolCall, error_text
from .tools import Tool, ToolOutput, call, output

__all__ = ["call_tools", "current_call", "permit"]

current_call: contextvars.ContextVar[tuple[State, str]] = contextvars.ContextVar("current_call")
"""The State and call id of the tool call running in this context (a subagent's parent)."""


async def call_tools(
    state: State,
    runnable: list[tuple[ToolCall, Tool]],
    save: Callable[[State], Awaitable[None]],
) -> None:
    """Run ``runnable`` concurrently, adding each result to ``state`` and saving it
    (``save``) the moment it arrives."""
    futures = [asyncio.ensure_future(tracing.tool(c, _call_one(state, c, t))) for c, t in runnable]
    try:
        for next_done in asyncio.as_completed(futures):
            pending, outcome, content, error = await next_done
            state.add_result(pending, outcome, content, error)
            with contextlib.suppress(Exception):
                # A failed save here does not stop the other tools: the save at the
                # end of use_tools writes what is missing, or raises.
                await save(state)
    finally:
        for future in futures:
            future.cancel()


async def _call_one(
    state: State, pending: ToolCall, tool: Tool
) -> tuple[ToolCall, Any, ToolOutput, BaseException | None]:
    token = current_call.set((state, pending.id))
    try:
        if tool.is_async:
            value = await call(tool, pending.input)
        else:
            value = await _on_daemon_thread(tool.function, pending.input)
        return pending, "ok", output(value), None
    except asyncio.CancelledError:
        raise
    except Exception as error:
        return pending, "error", error_text(error), error
    finally:
        current_call.reset(token)


async def _on_daemon_thread(function: Callable[..., Any], arguments: dict[str, Any]) -> Any:
    # Daemon threads, not an executor: a stopping process must not wait for a tool
    # that is still running (its call is closed as aborted instead).
    loop = asyncio.get_running_loop()
    future: asyncio.Future[Any] = loop.create_future()
    context = contextvars.copy_context()

    def settle(setter: Callable[[Any], None], value: Any) -> None:
        if not future.done():
            setter(value)

    def target() -> None:
        try:
            value = context.run(function, **arguments)
        except BaseException as error:
            outcome: tuple[Callable[[Any], None], Any] = (future.set_exception, error)
        else:
            outcome = (future.set_result, value)
        with contextlib.suppress(RuntimeError):  # the loop is gone: the run already ended
            loop.call_soon_threadsafe(settle, *outcome)

    threading.Thread(target=target, name="alpineagents-tool", daemon=True).start()
    return await future


async def permit(
    state: State, pending: ToolCall, permissions: Policy, ask: AskPerson | None
) -> bool | None:
    """Whether ``pending`` may run: True to run, False to refuse, None to leave it waiting
    for a person (an ``approval_request`` is added the first time)."""
    answer = state.approval(pending.id)
    if answer is not None:
        return answer
    decision = permissions(pending)
    if decision == "allow":
        return True
    if decision == "refuse":
        return False
    if ask is None:
        if all(asked.id != pending.id for asked in state.awaiting_approval):
            state.add(
                "approval_request",
                f"asks a person: {pending.name} {excerpt(json.dumps(pending.input), 120)}",
                {"call_id": pending.id, "name": pending.name, "input": pending.input},
            )
        return None
    allowed = ask(pending)
    if inspect.isawaitable(allowed):
        allowed = await allowed
    state.approve(pending.id, bool(allowed))
    return bool(allowed)
