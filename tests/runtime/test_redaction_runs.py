"""A secret the model quotes, in whichever form, is masked in everything a real run
writes: the answer it prints, the termination message, its log, the saved history and
``alpineagents show``; also a secret renewed in its file while the run goes on."""

from __future__ import annotations

import os
from pathlib import Path

from alpineagents.testing import ModelServer, hold, reply
from tests.bench.runner_process import RunnerProcess, Workspace, child_env

# Each as a Secret gives it: a --from-file value ends in a newline; a PEM-like value has
# several lines; a header value carries its scheme.
FROM_FILE = "team-token-from-a-file-1234\n"
PEM = "-----BEGIN KEY-----\nline-one-of-the-key-AAAA\nline-two-of-the-key-BBBB\n-----END KEY-----\n"
HEADER = "Bearer header-token-value-5678"
QUOTED = (
    "team-token-from-a-file-1234",
    "line-one-of-the-key-AAAA",
    "line-two-of-the-key-BBBB",
    "header-token-value-5678",
)


def everything_written(workspace: Workspace, runner: RunnerProcess, shown: str) -> str:
    saved = "".join(p.read_text() for p in workspace.runs.rglob("*") if p.is_file())
    message = runner.message_path.read_text()
    return "\n".join([runner.stdout, runner.stderr, message, saved, shown])


def show(workspace: Workspace, runners: list[RunnerProcess]) -> str:
    shown = RunnerProcess(
        ["show", "job", "--store", str(workspace.runs)],
        workdir=workspace.work,
        env=child_env(None),
        message_path=workspace.root / "show-termination-log",  # keeps the run's own
    )
    runners.append(shown)
    assert shown.wait() == 0, shown.stderr
    return shown.stdout


def test_each_form_of_a_secret_the_model_quotes_is_masked_everywhere(
    workspace: Workspace, model_server: ModelServer, runners: list[RunnerProcess]
) -> None:
    model_server.add(reply("Found: " + " | ".join(QUOTED)))
    runner = workspace.run(
        workspace.manifest(prompt="Print the keys."),
        TEAM_TOKEN=FROM_FILE,
        SIGNING_PRIVATE_KEY=PEM,
        UPSTREAM_AUTH_TOKEN=HEADER,
    )
    assert runner.process.returncode == 0, runner.stderr
    assert runner.stdout.strip() == "Found: *** | *** | *** | ***"
    assert runner.message["answer"] == "Found: *** | *** | *** | ***"
    shown = show(workspace, runners)
    assert "Found: *** | *** | *** | ***" in shown
    written = everything_written(workspace, runner, shown)
    for secret in QUOTED:
        assert secret not in written


def test_a_secret_renewed_in_its_file_during_the_run_is_masked(
    workspace: Workspace, model_server: ModelServer, runners: list[RunnerProcess]
) -> None:
    token_file = workspace.root / "session-token"
    token_file.write_text("first-session-token-0001\n")
    model_server.add(hold(reply("Now it is renewed-session-token-0002.")))
    runner = workspace.start(
        workspace.manifest(prompt="Which token?"), STORE_SESSION_TOKEN_FILE=str(token_file)
    )
    model_server.wait_for_requests(1)
    # The kubelet swaps a renewed Secret's file in place.
    renewed = workspace.root / "session-token.new"
    renewed.write_text("renewed-session-token-0002\n")
    os.replace(renewed, token_file)
    model_server.release()

    assert runner.wait() == 0, runner.stderr
    assert runner.stdout.strip() == "Now it is ***."
    shown = show(workspace, runners)
    assert "Now it is ***." in shown
    assert "renewed-session-token-0002" not in everything_written(workspace, runner, shown)


def test_no_secret_file_is_read_when_none_is_named(tmp_path: Path) -> None:
    # A plain variable ending in _FILE is not a secret: its file is not read.
    from alpineagents.redaction import Redactor

    plain = tmp_path / "notes"
    plain.write_text("ordinary-words-in-notes\n")
    redactor = Redactor.from_environment({"NOTES_FILE": str(plain)})
    assert redactor.text("ordinary-words-in-notes") == "ordinary-words-in-notes"
