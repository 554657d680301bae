"""``alpineagents``: run, resume and inspect agent runs from a shell.

``run [FILE.yaml]`` runs or resumes an AgentRun (in a pod: the spec comes from the file
``ALPINEAGENTS_SPEC_FILE`` names); ``approve ID CALL`` answers calls a run waits on; ``list``, ``show ID``, ``tail ID`` and ``delete ID`` look at
what a store holds; ``prune --older-than AGE`` deletes its old States (:mod:`.pruning`); ``ui`` shows it in a browser; ``pacer`` shares a key's rate limits
among runs (:mod:`alpineagents.pacing`). Each command is a few lines over
:mod:`alpineagents.runner`.
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import os
import signal
import sys
import time
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

from .errors import StoreUnavailableError
from .liveness import is_running, open_status
from .pod_contract import ENV_STANDBY_ID, ExitCode
from .pruning import ENDED, STATUSES, parse_age, parse_statuses, prunable
from .redaction import Redactor
from .runner import LogFormat, ProgressLog, SpecError, open_run_store, run_agent_run
from .runner.run import error_message
from .state import Entry, State
from .store.base import Record, Store
from .store.file import FileStore

TAIL_INTERVAL = 0.5  # seconds between two reads of a followed State


class CommandError(Exception):
    """A user mistake or an unreachable store: one line on stderr and an exit code."""

    def __init__(self, message: str, exit_code: int = 1) -> None:
        super().__init__(message)
        self.exit_code = exit_code


def main(argv: Sequence[str] | None = None) -> int:
    """Run the ``alpineagents`` command line; returns the exit code."""
    args = command_parser().parse_args(argv)
    try:
        code: int = args.command(args)
        sys.stdout.flush()
        return code
    except CommandError as error:
        print(f"alpineagents: {error}", file=sys.stderr)
        return error.exit_code
    except KeyboardInterrupt:
        return ExitCode.INTERRUPTED
    except BrokenPipeError:
        # The reader left (`alpineagents list | head`): stop quietly, as `ls | head` does.
        # Python's own flush at exit would fail again and print a traceback: point stdout
        # at /dev/null first.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 128 + signal.SIGPIPE


# ---------------------------------------------------------------------------- commands


def run(args: argparse.Namespace) -> int:
    """``run [FILE] [--store URL] [--id ID] [--offline]``: run or resume, showing progress.

    In a warm pool's standby pod (``ALPINEAGENTS_STANDBY_ID`` set) it first waits for the
    run the operator hands it (:mod:`alpineagents.runner.standby`)."""
    if os.environ.get(ENV_STANDBY_ID) and args.file is None:
        from .runner.standby import take_assignment

        take_assignment()
    # Everything the run prints passes a mask for its secrets (API key, store keys, ...).
    with Redactor.from_environment().guarding_stdio():
        log = ProgressLog(sys.stderr, format=_log_format(args))
        with _offline_model() if args.offline else contextlib.nullcontext():
            result = run_agent_run(args.file, store_url=args.store, state_id=args.id, log=log)
        if result.answer is not None:
            print(result.answer)
        if result.exit_code == ExitCode.WAITING_FOR_APPROVAL and log.format == "text":
            _print_next_step(args, result.message)
    return result.exit_code


def approve(args: argparse.Namespace) -> int:
    """``approve ID CALL... [--refuse] [--reason TEXT]``: answer tool calls a stopped run
    waits on, in its saved State; the next ``run`` goes on with the answers."""
    store = _store(args)
    _record(store, args.id)
    state: State = _reading(store, lambda: store.load(args.id))
    waiting = [call.id for call in state.awaiting_approval]
    if state.stopped != "waiting_for_approval" or not waiting:
        answered = bool(state.history) and state.history[-1].kind == "permission"
        why = (
            "its calls have their answers: run the manifest again to go on"
            if answered
            else state.stopped or "it is running, or its process was lost"
        )
        raise CommandError(f"{args.id} waits for no answer ({why})")
    calls = list(dict.fromkeys(args.calls))
    unknown = [call for call in calls if call not in waiting]
    if unknown:
        raise CommandError(
            f"{', '.join(unknown)}: not a call {args.id} waits on; it waits on "
            f"{', '.join(waiting)} (alpineagents show {args.id} lists them)"
        )
    others = [call for call in waiting if call not in calls]
    if others:
        # Answered calls saved next to unanswered ones would be closed as aborted on the
        # next load: a run goes on only when every call it waits on has its answer.
        raise CommandError(
            f"{args.id} also waits on {', '.join(others)}: answer every waiting call at "
            f"once (alpineagents approve {args.id} {' '.join(waiting)}), or give each its "
            f"own answer in the manifest's spec.approvals"
        )
    for call in calls:
        state.approve(call, not args.refuse, note=args.reason or "")
    _reading(store, lambda: store.save(state))
    word = "refused" if args.refuse else "allowed"
    print(
        f"{word} {', '.join(calls)} in {args.id}: run the manifest again to go on",
        file=sys.stderr,
    )
    return 0


def list_states(args: argparse.Namespace) -> int:
    """``list``: every saved State, most recently updated first."""
    store = _store(args)
    infos = _reading(store, store.list)
    if not infos:
        print(f"no saved States in {store!r}", file=sys.stderr)
        return 0
    width = max(len(info.id) for info in infos)
    for info in infos:
        updated = (
            info.updated_at.astimezone().strftime("%Y-%m-%d %H:%M:%S") if info.updated_at else "-"
        )
        status = info.stopped or open_status(store, info.id)
        first = (info.first_message or "").replace("\n", " ")[:60]
        print(f"{info.id:<{width}}  {updated}  {status:<20}  {info.entries:>5} entries  {first}")
    return 0


def show(args: argparse.Namespace) -> int:
    """``show ID``: the State's history, one line per entry."""
    store = _store(args)
    record = _record(store, args.id)
    log = ProgressLog(sys.stdout, format=_log_format(args), show_seq=True)
    if log.format == "text":
        info = record.info
        usage = info.get("usage") or {}
        print(
            f"{args.id}: {info.get('entries', len(record.entries))} entries, "
            f"{info.get('stopped') or open_status(store, args.id)}, "
            f"turns {info.get('turns', 0)}, "
            f"tokens in {usage.get('input_tokens', 0)} / out {usage.get('output_tokens', 0)}, "
            f"cache read {usage.get('cache_read_input_tokens', 0)} / written "
            f"{usage.get('cache_creation_input_tokens', 0)}, "
            f"{_cost_text(info, record.entries)}"
        )
    for entry in _entries(store, args.id, record):
        log.entry(args.id, entry)
    return 0


def _cost_text(info: Mapping[str, Any], entries: Sequence[Mapping[str, Any]]) -> str:
    """The estimated cost, said to be simulated when the offline echo model answered."""
    from .testing.echo import ECHO_MODEL_SUFFIX

    cost = f"about ${float(info.get('cost_usd') or 0.0):.4f}"
    echoed = any(
        str((entry.get("data") or {}).get("model", "")).endswith(ECHO_MODEL_SUFFIX)
        for entry in entries
        if entry.get("kind") == "model_reply"
    )
    return (
        f"{cost} simulated (the offline echo model, priced as the model asked for)"
        if echoed
        else cost
    )


def tail(args: argparse.Namespace) -> int:
    """``tail ID``: print the last entries, then new ones until the State stops (or Ctrl+C)."""
    store = _store(args)
    record = _record(store, args.id)
    log = ProgressLog(sys.stdout, format=_log_format(args), show_seq=True)
    entries = _entries(store, args.id, record)
    shown = len(entries)
    for entry in entries[max(0, shown - args.lines) :]:
        log.entry(args.id, entry)
    lost = False
    while record.info.get("stopped") is None and not lost:
        # Checked before the read: a run's lock goes only after its last save, so a read
        # after a lock found free holds everything the run saved.
        lost = is_running(store, args.id) is False
        if not lost:
            time.sleep(args.interval)
        latest = _reading(store, lambda: store.read(args.id))
        if latest is None:
            raise CommandError(f"State {args.id!r} was deleted")
        record = latest
        for entry in _entries(store, args.id, record)[shown:]:
            log.entry(args.id, entry)
            shown = entry.seq + 1
    if record.info.get("stopped") is None and lost:
        raise CommandError(
            f"no process runs {args.id} (lost, or waiting to be run again): "
            f"alpineagents run resumes it"
        )
    return 0


def delete(args: argparse.Namespace) -> int:
    """``delete ID``: delete one saved State (not its subagents)."""
    store = _store(args)
    _record(store, args.id)
    _reading(store, lambda: store.delete(args.id))
    print(f"deleted {args.id} from {store!r}", file=sys.stderr)
    return 0


def prune(args: argparse.Namespace) -> int:
    """``prune --older-than AGE``: delete the States last updated longer ago, the ended
    ones unless ``--status`` names others (never one a process runs)."""
    try:
        age, statuses = parse_age(args.older_than), parse_statuses(args.status)
    except ValueError as error:
        raise CommandError(str(error), ExitCode.NOT_RETRYABLE) from None
    store = _store(args)
    chosen = prunable(store, _reading(store, store.list), age, statuses)
    for state in chosen:
        if not args.dry_run:
            _reading(store, functools.partial(store.delete, state.id))
        updated = (
            state.updated_at.astimezone().strftime("%Y-%m-%d %H:%M:%S") if state.updated_at else "-"
        )
        print(f"{state.id}  {updated}  {state.status}")
    done = "would delete" if args.dry_run else "deleted"
    print(f"{done} {len(chosen)} State(s) from {store!r}", file=sys.stderr)
    return 0


def fork(args: argparse.Namespace) -> int:
    """``fork ID --at N``: a new State from entries 0..N of ID, edited; ID is unchanged."""
    from .forking import fork as fork_state

    store = _store(args)
    fork_id = args.id_of_fork or f"{args.id}-fork-{args.at}"
    results: dict[str, str] = {}
    for edit in args.result or ():
        call_id, sep, content = edit.partition("=")
        if not sep or not call_id:
            raise CommandError(f"--result takes CALL_ID=TEXT, not {edit!r}", ExitCode.NOT_RETRYABLE)
        results[call_id] = content
    _record(store, args.id)  # an unknown id says so, as for show
    state = _reading(
        store,
        lambda: fork_state(store, args.id, args.at, fork_id, message=args.message, results=results),
    )
    print(
        f"forked {args.id} at entry {args.at} as {state.id} ({len(state.history)} entries); "
        f"run it on with: alpineagents run FILE.yaml --id {state.id}",
        file=sys.stderr,
    )
    return 0


def ui(args: argparse.Namespace) -> int:
    """``ui``: the run viewer in a browser (see :mod:`alpineagents.viewer`)."""
    from .viewer import command

    try:
        return command.serve(args, _store(args, must_exist=False))
    except command.UsageError as error:
        raise CommandError(str(error), ExitCode.NOT_RETRYABLE) from None


# ---------------------------------------------------------------------------- internals


def command_parser() -> argparse.ArgumentParser:
    """The ``alpineagents`` command line's parser (docs/cli.md is generated from it)."""
    parser = argparse.ArgumentParser(
        prog="alpineagents", description="Durable LLM agent runs: run, resume and inspect them."
    )
    commands = parser.add_subparsers(dest="name", required=True, metavar="COMMAND")
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument(
        "--store",
        metavar="URL",
        help="where States are saved: a folder, file:///path or s3://bucket/prefix?endpoint=host:port "
        "(default: $ALPINEAGENTS_STORE, else ./.agent-runs)",
    )
    common.add_argument(
        "--log-format",
        choices=("text", "json"),
        help="text lines, or one JSON object per line (default: $ALPINEAGENTS_LOG_FORMAT, else text)",
    )

    command = commands.add_parser("run", parents=[common], help="run or resume an AgentRun")
    command.add_argument(
        "file",
        nargs="?",
        metavar="FILE.yaml",
        help="AgentRun manifest (default: the spec in $ALPINEAGENTS_SPEC_FILE or $ALPINEAGENTS_SPEC)",
    )
    command.add_argument(
        "--id", help="State id (default: $ALPINEAGENTS_STATE_ID, else metadata.name)"
    )
    command.add_argument(
        "--offline",
        action="store_true",
        help="answer with the scripted echo model on a local port (no API key needed)",
    )
    command.set_defaults(command=run)

    command = commands.add_parser(
        "approve", parents=[common], help="answer tool calls a run waits on (exit 76)"
    )
    command.add_argument("id", metavar="ID")
    command.add_argument("calls", nargs="+", metavar="CALL", help="a call id (show lists them)")
    command.add_argument("--refuse", action="store_true", help="refuse the calls (default: allow)")
    command.add_argument(
        "--reason", metavar="TEXT", help="why, kept in the history with the answer"
    )
    command.set_defaults(command=approve)

    command = commands.add_parser("list", parents=[common], help="list saved States")
    command.set_defaults(command=list_states)

    command = commands.add_parser("show", parents=[common], help="show a State's history")
    command.add_argument("id", metavar="ID")
    command.set_defaults(command=show)

    command = commands.add_parser("tail", parents=[common], help="follow a running State")
    command.add_argument("id", metavar="ID")
    command.add_argument(
        "-n", "--lines", type=int, default=10, help="entries to show first (default 10)"
    )
    command.add_argument(
        "--interval", type=float, default=TAIL_INTERVAL, help="seconds between reads (default 0.5)"
    )
    command.set_defaults(command=tail)

    command = commands.add_parser("delete", parents=[common], help="delete a saved State")
    command.add_argument("id", metavar="ID")
    command.set_defaults(command=delete)

    command = commands.add_parser(
        "prune", parents=[common], help="delete saved States older than an age"
    )
    command.add_argument(
        "--older-than",
        required=True,
        metavar="AGE",
        help="States last updated longer ago than AGE: 30d, 12h, 1d12h, 90m, 2w",
    )
    command.add_argument(
        "--status",
        action="append",
        metavar="STATUS",
        help=f"only States with this status (repeat it, or separate with commas): "
        f"{', '.join(STATUSES)}; default: {', '.join(ENDED)}",
    )
    command.add_argument(
        "--dry-run", action="store_true", help="list the States it would delete; delete none"
    )
    command.set_defaults(command=prune)

    command = commands.add_parser(
        "fork", parents=[common], help="a new State from a saved one's first entries"
    )
    command.add_argument("id", metavar="ID", help="the State to fork (left as it is)")
    command.add_argument(
        "--at",
        type=int,
        required=True,
        metavar="N",
        help="the last entry to copy (show lists them)",
    )
    command.add_argument(
        "--as", dest="id_of_fork", metavar="NEW_ID", help="the fork's id (default: ID-fork-N)"
    )
    command.add_argument(
        "--message", metavar="TEXT", help="replace entry N, a user's message, with TEXT"
    )
    command.add_argument(
        "--result",
        action="append",
        metavar="CALL_ID=TEXT",
        help="replace a tool call's result with TEXT (repeatable)",
    )
    command.set_defaults(command=fork)

    from .viewer.command import add_arguments

    command = commands.add_parser("ui", parents=[common], help="see runs in a browser")
    add_arguments(command)
    command.set_defaults(command=ui)

    from .pacing import command as pacer

    command = commands.add_parser("pacer", help="share a key's rate limits among runs")
    pacer.add_arguments(command)
    command.set_defaults(command=_pacer)
    return parser


def _pacer(args: argparse.Namespace) -> int:
    from .pacing.command import serve

    try:
        return serve(args)
    except ValueError as error:
        raise CommandError(str(error), ExitCode.NOT_RETRYABLE) from None


def _log_format(args: argparse.Namespace) -> LogFormat:
    chosen = args.log_format or os.environ.get("ALPINEAGENTS_LOG_FORMAT") or "text"
    if chosen not in ("text", "json"):
        raise CommandError(
            f"ALPINEAGENTS_LOG_FORMAT: must be text or json, not {chosen!r}", ExitCode.NOT_RETRYABLE
        )
    return "json" if chosen == "json" else "text"


def _store(args: argparse.Namespace, *, must_exist: bool = True) -> Store:
    try:
        store = open_run_store(args.store)
    except SpecError as error:
        raise CommandError(str(error), ExitCode.NOT_RETRYABLE) from None
    except StoreUnavailableError as error:
        raise CommandError(str(error), ExitCode.RETRYABLE) from None
    if must_exist and isinstance(store, FileStore) and not store.folder.is_dir():
        # A mistyped --store would otherwise read as an empty store.
        raise CommandError(
            f"the store folder {str(store.folder)!r} does not exist (check --store or "
            f"$ALPINEAGENTS_STORE; alpineagents run creates it)"
        )
    return store


def _reading(store: Store, call: Any) -> Any:
    try:
        return call()
    except (KeyboardInterrupt, SystemExit):
        raise
    except ValueError as error:
        raise CommandError(error_message(error), ExitCode.NOT_RETRYABLE) from None
    except Exception as error:
        raise CommandError(
            f"store unavailable: {store!r}: {error_message(error)}", ExitCode.RETRYABLE
        ) from None


def _record(store: Store, state_id: str) -> Record:
    record: Record | None = _reading(store, lambda: store.read(state_id))
    if record is None:
        raise CommandError(
            f"no saved State {state_id!r} in {store!r} (alpineagents list shows the saved ones)"
        )
    return record


def _entries(store: Store, state_id: str, record: Record) -> list[Entry]:
    """The saved entries, in seq order: what ``State.from_record`` loads, without the
    entries it adds to close an open turn (those are not saved)."""
    state: State = _reading(store, lambda: State.from_record(state_id, record))
    return state.history[: state.loaded_entries]


def _print_next_step(args: argparse.Namespace, message: dict[str, Any]) -> None:
    """After exit 76 on a laptop: the commands that answer the calls and go on."""
    state_id = message["stateId"]
    calls = " ".join(p["callId"] for p in message["pendingApprovals"])
    store = f" --store {args.store}" if args.store else ""
    again = (
        " ".join(
            [
                "alpineagents run",
                *([args.file] if args.file else []),
                *([f"--id {args.id}"] if args.id else []),
                *(["--offline"] if args.offline else []),
            ]
        )
        + store
    )
    print(
        f"next: alpineagents approve {state_id} {calls}{store}   (or --refuse --reason TEXT)\n"
        f"then: {again}",
        file=sys.stderr,
    )


@contextlib.contextmanager
def _offline_model() -> Iterator[None]:
    """The scripted echo model on a loopback port, and the client pointed at it."""
    from .testing import ModelServer

    with ModelServer(echo=True) as server, server.in_environment():
        yield
