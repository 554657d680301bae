"""The runner: what an agent pod runs, and ``alpineagents run`` on a laptop.

It turns SIGTERM into a clean stop, reads an AgentRun spec into a
:class:`~.spec.RunPlan` (:mod:`.spec`), builds the Agent (:mod:`.build`), loads the
saved State if the store has it (resume) or creates it from the spec, records the
approvals the spec gives, runs it, and reports how it ended (:mod:`.run`): an
:class:`ExitCode` and a termination message written where Kubernetes reads it (the
contract with the operator is :mod:`alpineagents.pod_contract`). :mod:`.progress` writes
a line per saved step.

Each step is a plain function, so the CLI and tests can call them one by one;
:func:`run_agent_run` strings them together.
"""

from ..pod_contract import TERMINATION_MESSAGE_LIMIT, ExitCode, write_termination_message
from .build import build_agent
from .progress import LogFormat, ProgressLog, entry_event
from .run import (
    RunResult,
    install_sigterm_handler,
    open_run_store,
    open_state,
    record_approvals,
    run_agent_run,
    termination_message,
)
from .spec import Approval, RunPlan, SpecError, parse_spec, read_manifest, spec_from_environment

__all__ = [
    "TERMINATION_MESSAGE_LIMIT",
    "Approval",
    "ExitCode",
    "LogFormat",
    "ProgressLog",
    "RunPlan",
    "RunResult",
    "SpecError",
    "build_agent",
    "entry_event",
    "install_sigterm_handler",
    "open_run_store",
    "open_state",
    "parse_spec",
    "read_manifest",
    "record_approvals",
    "run_agent_run",
    "spec_from_environment",
    "termination_message",
    "write_termination_message",
]
