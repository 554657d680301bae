"""The Agent a :class:`~alpineagents.runner.spec.RunPlan` asks for (:func:`build_agent`)."""

from __future__ import annotations

import importlib
import importlib.util
import inspect
import os
import sys
from collections.abc import Callable, Mapping
from typing import Any

from .. import builtin_tools
from ..agent import Agent
from ..mcp import MCPServer
from ..mcp_spec import MCPSpecError, mcp_servers
from ..model import Retry
from ..pacing import Pacer, SharedPacer, key_fingerprint
from ..permissions import Decision, Policy
from ..pod_contract import ENV_PACER, ENV_PACER_SHARE
from ..providers import Provider, ProviderError
from ..state import ToolCall, error_text
from .long_run_spec import prices_from
from .spec import RunPlan, SpecError

__all__ = ["build_agent", "pacer_for"]


def build_agent(
    plan: RunPlan,
    *,
    workdir: str | os.PathLike[str] | None = None,
    environ: Mapping[str, str] | None = None,
) -> Agent:
    """The Agent the plan asks for: the built-in tools, or the ``agent`` factory's Agent.

    With ``agent``, the factory is imported and called (with the spec dict if it takes
    one argument); the spec's model is set on its Agent, and the spec's other fields,
    when given, apply on top (tools are added, ``requireApproval`` asks first).
    ``mcpServers`` are added to its toolsets, their secrets read from ``environ``.
    Raises :class:`SpecError` for anything that does not fit.
    """
    env = os.environ if environ is None else environ
    retry = _retry_from(env)
    tools = builtin_tools.make_tools(plan.tools, workdir=workdir or os.getcwd())
    if plan.agent is None:
        agent = Agent(
            plan.model,
            tools=tools,
            system=plan.system,
            max_tokens=plan.max_tokens or 8192,
            max_turns=plan.max_turns,
            retry=retry,
        )
    else:
        agent = _agent_from_factory(plan.agent, plan.spec)
        agent.model = plan.model
        clash = [t.name for t in tools if t.name in agent.tools]
        if clash:
            raise SpecError(
                "spec.tools",
                f"{clash[0]!r} is also a tool of the Agent from {plan.agent}; list it in one place",
            )
        agent.tools.update({t.name: t for t in tools})
        if plan.system is not None:
            agent.system = plan.system
        if plan.max_tokens is not None:
            agent.max_tokens = plan.max_tokens
        if plan.max_turns is not None:
            agent.max_turns = plan.max_turns
        if retry is not None:
            agent.retry = retry
    # The spec's long-run fields, where given, apply on top of a factory's Agent too.
    long_run = plan.long_run
    if "promptCache" in plan.spec:
        agent.prompt_cache = long_run.prompt_cache
    if "contextWindow" in plan.spec:
        agent.context_window = long_run.context_window
    if "compaction" in plan.spec:
        agent.compaction = long_run.compaction
    if "budget" in plan.spec:
        agent.budget = long_run.budget
    agent.prices = prices_from(env, SpecError) or agent.prices
    if plan.spec.get("provider") is not None:
        try:
            agent.provider = Provider.from_spec(plan.spec["provider"], env)
            agent.provider.check_identity(env)
        except ProviderError as error:
            where = error.where if error.where.startswith("spec.") else f"spec.{error.where}"
            raise SpecError(where, error.problem) from None
    servers = _mcp_servers(plan, env)
    agent.toolsets.extend(servers)
    if plan.require_approval:
        names = _tool_names(agent, servers)
        unknown = [n for n in plan.require_approval if names is not None and n not in names]
        if unknown:
            known = ", ".join(sorted(agent.tools)) or "none"
            raise SpecError(
                "spec.requireApproval",
                f"{unknown[0]!r} is not a tool of this agent (its tools: {known})",
            )
        agent.permissions = _asking_first(frozenset(plan.require_approval), agent.permissions)
    return agent


def _mcp_servers(plan: RunPlan, environ: Mapping[str, str]) -> list[MCPServer]:
    if not plan.mcp_servers:
        return []
    if importlib.util.find_spec("mcp") is None:
        raise SpecError(
            "spec.mcpServers",
            "this image has no MCP SDK: build it with the mcp extra (alpineagents[mcp])",
        )
    try:
        return mcp_servers(plan.mcp_servers, environ)
    except MCPSpecError as error:
        raise SpecError(error.where, error.problem) from None


def _tool_names(agent: Agent, servers: list[MCPServer]) -> set[str] | None:
    """Every tool name the agent may have, or None when a toolset may list any tool
    (a server without an allow-list: its tools are known only when the run starts)."""
    if len(agent.toolsets) != len(servers) or any(s.allow is None for s in servers):
        return None
    return set(agent.tools).union(*(s.allow or () for s in servers))


def _asking_first(names: frozenset[str], policy: Policy) -> Policy:
    def decide(call: ToolCall) -> Decision:
        decision = policy(call)
        if decision != "refuse" and call.name in names:
            return "ask"
        return decision

    return decide


def pacer_for(
    environ: Mapping[str, str], run: str, priority: int, provider: Provider | None = None
) -> Pacer | None:
    """The shared limiter's pacer when ``ALPINEAGENTS_PACER`` names one (None: the process's
    own pacer, by the headers). ``run`` keeps the run's place in line across its pods; runs
    share a line when they share a key and endpoint (a cloud provider's: its region's)."""
    url = environ.get(ENV_PACER)
    if not url:
        return None
    key = environ.get("ANTHROPIC_API_KEY") or environ.get("ANTHROPIC_AUTH_TOKEN") or ""
    endpoint = environ.get("ANTHROPIC_BASE_URL") or "https://api.anthropic.com"
    if provider is not None and (provider.type != "anthropic" or provider.base_url):
        where = (provider.region, provider.project_id, provider.resource, provider.base_url)
        endpoint = ":".join([provider.type, *(part or "" for part in where)])
        if provider.type != "anthropic":
            key = provider.credentials or ""  # a cloud identity's quota is its endpoint's
    try:
        return SharedPacer(
            url,
            key=key_fingerprint(f"{endpoint}\n{key}"),
            run=run,
            namespace=environ.get(ENV_PACER_SHARE) or "default",
            priority=priority,
        )
    except ValueError as error:
        raise SpecError(ENV_PACER, str(error)) from None


def _retry_from(environ: Mapping[str, str]) -> Retry | None:
    raw = environ.get("ALPINEAGENTS_MODEL_RETRIES")
    if raw is None or raw == "":
        return None
    try:
        attempts = int(raw)
    except ValueError:
        attempts = 0
    if attempts < 1:
        raise SpecError(
            "ALPINEAGENTS_MODEL_RETRIES",
            f"must be a whole number of at least 1 (attempts per model request), not {raw!r}",
        )
    return Retry(attempts=attempts)


def _agent_from_factory(path: str, spec: Mapping[str, Any]) -> Agent:
    module_name, _, attribute = path.partition(":")
    # Like `python -m`: the folder a user runs from holds their agent module.
    if os.getcwd() not in sys.path and "" not in sys.path:
        sys.path.insert(0, os.getcwd())
    try:
        target: Any = importlib.import_module(module_name)
    except Exception as error:
        raise SpecError(
            "spec.agent",
            f"cannot import {module_name!r} ({error_text(error)}); install it in the image "
            f"or put it on PYTHONPATH",
        ) from None
    for part in attribute.split("."):
        try:
            target = getattr(target, part)
        except AttributeError:
            raise SpecError(
                "spec.agent", f"{module_name!r} has no {attribute!r}; check the name after ':'"
            ) from None
    if not callable(target):
        raise SpecError("spec.agent", f"{path} is not callable; point it at a factory function")
    try:
        agent = target(dict(spec)) if _takes_an_argument(target) else target()
    except Exception as error:
        raise SpecError("spec.agent", f"{path} raised {error_text(error)}") from None
    if not isinstance(agent, Agent):
        raise SpecError(
            "spec.agent", f"{path} returned {type(agent).__name__}, not an alpineagents.Agent"
        )
    return agent


def _takes_an_argument(factory: Callable[..., Any]) -> bool:
    try:
        parameters = inspect.signature(factory).parameters.values()
    except (TypeError, ValueError):
        return False
    positional = (
        inspect.Parameter.POSITIONAL_ONLY,
        inspect.Parameter.POSITIONAL_OR_KEYWORD,
        inspect.Parameter.VAR_POSITIONAL,
    )
    return any(p.kind in positional for p in parameters)
