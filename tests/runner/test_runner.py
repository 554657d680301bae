"""The runner as pods run it: real processes, real signals, the scripted model server.

Each test starts ``python -m alpineagents run`` as a child process against a FileStore in
a temporary folder, with the scripted model server as its model, and looks at what a
user or the operator sees: the exit code, the termination message, the saved State,
the files its tools wrote, and the requests the model got.
"""

from __future__ import annotations

import contextlib
import http.server
import importlib.metadata
import json
import signal
import threading
from pathlib import Path
from typing import Any

import pytest

from alpineagents import Message, State, builtin_tools
from alpineagents.pod_contract import runner_version
from alpineagents.runner import (
    TERMINATION_MESSAGE_LIMIT,
    ExitCode,
    SpecError,
    parse_spec,
    termination_message,
)
from alpineagents.state import UNKNOWN_RESULT
from alpineagents.testing import ModelServer, error, hold, reply, tool_use
from tests.bench.runner_process import (
    BLOCKING,
    RunnerProcess,
    Workspace,
    child_env,
    last_tool_result_block,
    tool_results,
    wait_for_file,
    wait_until_gone,
    with_examples,
)

# ---------------------------------------------------------------------------- signals


def test_sigterm_while_a_tool_runs_saves_and_the_next_run_resumes(
    workspace: Workspace, model_server: ModelServer, leftover_commands: list[int]
) -> None:
    model_server.add(reply("Running it.", tool_use("shell", {"command": BLOCKING}, id="toolu_1")))
    manifest = workspace.manifest(tools=["shell"], prompt="Run the long job.")

    runner = workspace.start(manifest)
    pid = int(wait_for_file(workspace.work / "started"))
    leftover_commands.append(pid)
    runner.signal(signal.SIGTERM)

    assert runner.wait() == ExitCode.SIGTERM == 143
    message = runner.message
    assert message["outcome"] == "stopped"
    assert message["stateId"] == "job"
    assert "SystemExit" in message["error"]
    wait_until_gone(pid)  # the stopped run killed its command too

    state = workspace.store.load("job")
    (result,) = tool_results(state)
    assert (result.outcome, result.text) == ("aborted", "(aborted: SystemExit)")
    assert state.stopped == "interrupted"
    assert message["lastSavedSeq"] == len(state.history) - 1

    model_server.add(reply("The job was stopped; I will not run it again."))
    again = workspace.run(manifest)
    assert again.process.returncode == 0, again.stderr
    assert again.message["outcome"] == "answered"
    assert again.message["answer"] == "The job was stopped; I will not run it again."
    assert again.message["aborted"] == []  # the first run closed its own call
    assert (workspace.work / "started").read_text().count("\n") == 1
    assert last_tool_result_block(model_server.requests[-1].body)["is_error"] is True


def test_sigterm_while_the_model_is_asked_takes_the_request_back(
    workspace: Workspace, model_server: ModelServer
) -> None:
    model_server.add(hold(reply("Too late.")))
    manifest = workspace.manifest(prompt="Think hard.")
    runner = workspace.start(manifest)
    model_server.wait_for_requests(1)
    runner.signal(signal.SIGTERM)
    assert runner.wait() == 143
    assert runner.message["outcome"] == "stopped"
    assert runner.message["turns"] == 0
    kinds = [e.kind for e in workspace.store.load("job").history]
    assert kinds == ["message", "model_request", "model_error", "stop"]

    model_server.add(reply("Thought."))
    again = workspace.run(manifest)
    assert again.process.returncode == 0, again.stderr
    assert again.message["answer"] == "Thought."
    # The same request again (its cache breakpoint too), with nothing of the stopped one.
    assert model_server.requests[-1].body["messages"] == [
        {
            "role": "user",
            "content": [
                {"type": "text", "text": "Think hard.", "cache_control": {"type": "ephemeral"}}
            ],
        }
    ]
    assert model_server.requests[-1].body == model_server.requests[0].body


def test_sigterm_during_a_long_streamed_model_call_exits_without_waiting_for_the_reply(
    workspace: Workspace, model_server: ModelServer
) -> None:
    # A long reply (maxTokens past the streaming threshold) that the model still writes:
    # a stopping runner saves and exits, closing the call instead of waiting it out.
    model_server.add(hold(reply("A long essay.")))
    manifest = workspace.manifest(prompt="Write the essay.", maxTokens=32000)
    runner = workspace.start(manifest)
    model_server.wait_for_requests(1)
    runner.signal(signal.SIGTERM)
    assert runner.wait() == ExitCode.SIGTERM
    assert model_server.release() == 1  # the reply was still held when the runner exited
    assert runner.message["outcome"] == "stopped"
    state = workspace.store.load("job")
    assert [e.kind for e in state.history] == ["message", "model_request", "model_error", "stop"]
    assert runner.message["lastSavedSeq"] == len(state.history) - 1
    assert state.stopped == "interrupted"


def test_sigkill_mid_tool_resumes_without_running_the_tool_again(
    workspace: Workspace, model_server: ModelServer, leftover_commands: list[int]
) -> None:
    model_server.add(reply(tool_use("shell", {"command": BLOCKING}, id="toolu_send")))
    manifest = workspace.manifest(tools=["shell"], prompt="Send the email.")

    runner = workspace.start(manifest)
    leftover_commands.append(int(wait_for_file(workspace.work / "started")))
    runner.signal(signal.SIGKILL)
    assert runner.wait() == -signal.SIGKILL

    model_server.add(reply("I checked: the email may have gone out, so I stop here."))
    again = workspace.run(manifest)
    assert again.process.returncode == 0, again.stderr
    assert again.message["aborted"] == ["toolu_send"]
    assert again.message["outcome"] == "answered"

    state = workspace.store.load("job")
    (result,) = tool_results(state)
    assert result.outcome == "aborted"
    assert result.text.startswith("(unknown: ")
    assert result.text == UNKNOWN_RESULT
    assert (workspace.work / "started").read_text().count("\n") == 1  # never run twice
    sent = last_tool_result_block(model_server.requests[-1].body)
    assert sent["tool_use_id"] == "toolu_send"
    assert sent["content"].startswith("(unknown: ")
    assert "closed as aborted: toolu_send" in again.stderr


def test_a_finished_run_run_again_exits_0_without_asking_the_model(
    workspace: Workspace, model_server: ModelServer
) -> None:
    model_server.add(reply("Hello!"))
    manifest = workspace.manifest(prompt="Say hello.")
    first = workspace.run(manifest)
    assert first.process.returncode == 0, first.stderr
    assert first.stdout.strip() == "Hello!"
    asked = len(model_server.requests)

    again = workspace.run(manifest)
    assert again.process.returncode == 0, again.stderr
    assert len(model_server.requests) == asked
    assert again.message == first.message
    assert again.stdout.strip() == "Hello!"


# ---------------------------------------------------------------------------- exit codes


@pytest.mark.parametrize(
    ("spec", "expected"),
    [
        ({"prompt": "hi", "model": None}, "spec.model: required"),
        ({"prompt": "hi", "tools": ["shel"]}, "spec.tools: unknown tool 'shel'; built-in tools are: fetch_url, read_file, shell, write_file"),
        ({"prompt": "hi", "agent": "no_such_module_here:make"}, "spec.agent: cannot import 'no_such_module_here'"),
        ({"prompt": "hi", "agent": "not a path"}, "spec.agent: 'not a path' is not an import path"),
        ({"prompt": "hi", "maxTurns": 0}, "spec.maxTurns: must be a whole number of at least 1"),
        ({}, "spec: needs a prompt"),
        ({"prompt": "hi", "approvals": [{"callId": "x"}]}, "spec.approvals[0].allow: required"),
        ({"prompt": "hi", "requireApproval": ["shell"]}, "spec.requireApproval: 'shell' is not a tool of this agent"),
    ],
)  # fmt: skip
def test_a_spec_that_cannot_run_exits_65_naming_the_field(
    workspace: Workspace, model_server: ModelServer, spec: dict[str, Any], expected: str
) -> None:
    runner = workspace.run(workspace.manifest(**spec))
    assert runner.process.returncode == ExitCode.NOT_RETRYABLE == 65
    assert runner.message["outcome"] == "failed"
    assert runner.message["error"].startswith(expected), runner.message["error"]
    assert runner.message["lastSavedSeq"] is None
    assert expected in runner.stderr
    assert "Traceback" not in runner.stderr
    assert model_server.requests == []
    assert workspace.store.read("job") is None


def test_a_model_that_stays_unavailable_exits_75_and_the_next_run_asks_again(
    workspace: Workspace, model_server: ModelServer
) -> None:
    # A 500 (a 529 overload is a wait, never a failure: tests/runtime/test_pacing.py).
    model_server.add(error(500), error(500))
    manifest = workspace.manifest(prompt="Summarize.")
    runner = workspace.run(manifest, ALPINEAGENTS_MODEL_RETRIES="2")
    assert runner.process.returncode == ExitCode.RETRYABLE == 75
    assert runner.message["outcome"] == "retryable"
    assert runner.message["error"].startswith("model unavailable: ")
    assert "500" in runner.message["error"]
    assert len(model_server.requests) == 2

    model_server.add(reply("Summary."))
    again = workspace.run(manifest)
    assert again.process.returncode == 0, again.stderr
    assert again.message["answer"] == "Summary."


def test_a_model_that_refuses_the_request_exits_65(
    workspace: Workspace, model_server: ModelServer
) -> None:
    model_server.add(error(400, "max_tokens: too large"))
    runner = workspace.run(workspace.manifest(prompt="Hi."))
    assert runner.process.returncode == ExitCode.NOT_RETRYABLE
    assert "max_tokens: too large" in runner.message["error"]


def test_waiting_for_approval_exits_76_and_approvals_resume_the_run(
    workspace: Workspace, model_server: ModelServer
) -> None:
    command = {"command": "echo deployed >> deployed"}
    model_server.add(reply("Deploying.", tool_use("shell", command, id="toolu_deploy")))
    spec: dict[str, Any] = {"prompt": "Deploy.", "tools": ["shell"], "requireApproval": ["shell"]}

    runner = workspace.run(workspace.manifest(**spec))
    assert runner.process.returncode == ExitCode.WAITING_FOR_APPROVAL == 76
    assert runner.message["outcome"] == "waiting_for_approval"
    assert runner.message["pendingApprovals"] == [
        {"callId": "toolu_deploy", "name": "shell", "input": command}
    ]
    assert not (workspace.work / "deployed").exists()

    asked = len(model_server.requests)
    still = workspace.run(
        workspace.manifest(**spec, approvals=[{"callId": "toolu_other", "allow": True}])
    )
    assert still.process.returncode == 76
    assert len(model_server.requests) == asked  # nothing to ask the model while it waits

    model_server.add(reply("Deployed."))
    approved = [{"callId": "toolu_deploy", "allow": True, "note": "go ahead"}]
    done = workspace.run(workspace.manifest(**spec, approvals=approved))
    assert done.process.returncode == 0, done.stderr
    assert done.message["answer"] == "Deployed."
    assert (workspace.work / "deployed").read_text() == "deployed\n"
    permission = [e for e in workspace.store.load("job").history if e.kind == "permission"]
    assert [e.data["allow"] for e in permission] == [True]
    assert "go ahead" in permission[0].text


def test_a_refusal_in_approvals_refuses_the_call(
    workspace: Workspace, model_server: ModelServer
) -> None:
    model_server.add(reply(tool_use("shell", {"command": "touch ran"}, id="toolu_rm")))
    spec: dict[str, Any] = {"prompt": "Clean.", "tools": ["shell"], "requireApproval": ["shell"]}
    assert workspace.run(workspace.manifest(**spec)).process.returncode == 76

    model_server.add(reply("Understood, not cleaning."))
    refused = [{"callId": "toolu_rm", "allow": False}]
    done = workspace.run(workspace.manifest(**spec, approvals=refused))
    assert done.process.returncode == 0, done.stderr
    assert not (workspace.work / "ran").exists()
    (result,) = tool_results(workspace.store.load("job"))
    assert result.outcome == "refused"


def test_max_turns_exits_77_and_stays_final(
    workspace: Workspace, model_server: ModelServer
) -> None:
    model_server.add(reply(tool_use("shell", {"command": "echo once >> turns"})))
    manifest = workspace.manifest(prompt="Loop.", tools=["shell"], maxTurns=1)
    runner = workspace.run(manifest)
    assert runner.process.returncode == ExitCode.MAX_TURNS == 77
    assert runner.message["outcome"] == "max_turns"
    assert runner.message["turns"] == 1
    assert (workspace.work / "turns").read_text() == "once\n"

    asked = len(model_server.requests)
    again = workspace.run(manifest)
    assert again.process.returncode == 77  # the limit counts the AgentRun's turns, not a pod's
    assert len(model_server.requests) == asked


def test_an_unreadable_state_format_exits_65(
    workspace: Workspace, model_server: ModelServer
) -> None:
    store = workspace.store
    state = State("job", [Message.user("hi")])
    store.save(state)
    info_path = workspace.runs / "job" / "info.json"
    info = json.loads(info_path.read_text())
    info_path.write_text(json.dumps({**info, "v": 99}))
    runner = workspace.run(workspace.manifest(prompt="hi"))
    assert runner.process.returncode == ExitCode.NOT_RETRYABLE
    assert "format 99" in runner.message["error"]


def test_an_unreachable_store_exits_75(workspace: Workspace, model_server: ModelServer) -> None:
    blocked = workspace.root / "not-a-folder"
    blocked.write_text("a file where the store's folder should be")
    runner = RunnerProcess(
        ["run", workspace.manifest(prompt="hi"), "--store", str(blocked / "runs")],
        workdir=workspace.work,
        env=child_env(model_server),
    )
    workspace.runners.append(runner)
    assert runner.wait() == ExitCode.RETRYABLE
    assert runner.message["outcome"] == "retryable"
    assert runner.message["error"].startswith("store unavailable: ")
    assert "Traceback" not in runner.stderr


# ---------------------------------------------------------------------------- messages


def test_the_termination_message_reports_the_run(
    workspace: Workspace, model_server: ModelServer
) -> None:
    model_server.add(reply(tool_use("shell", {"command": "echo hi"})), reply("All done. " * 300))
    runner = workspace.run(workspace.manifest(prompt="Go.", tools=["shell"]))
    assert runner.process.returncode == 0, runner.stderr
    message = runner.message
    assert set(message) == {
        "outcome",
        "stateId",
        "lastSavedSeq",
        "turns",
        "usage",
        "costUSD",
        "answer",
        "error",
        "pendingApprovals",
        "aborted",
        "runnerVersion",
    }
    # The image's ALPINEAGENTS_VERSION in a pod; here, outside one, the package's version.
    assert (
        message["runnerVersion"] == runner_version({}) == importlib.metadata.version("alpineagents")
    )
    state = workspace.store.load("job")
    assert message["lastSavedSeq"] == len(state.history) - 1
    assert message["turns"] == 2 == state.turns
    assert message["usage"] == state.usage
    assert message["usage"]["input_tokens"] > 0
    assert message["costUSD"] == round(state.cost_usd, 6) > 0
    assert len(message["answer"]) == 1000
    assert state.answer is not None and state.answer.startswith(message["answer"][:-1])
    assert message["error"] is None
    assert len(runner.message_path.read_bytes()) <= TERMINATION_MESSAGE_LIMIT


def test_a_termination_message_with_many_large_approvals_fits_in_4096_bytes() -> None:
    state = State("big", [Message.user("go")])
    calls = [
        {
            "type": "tool_use",
            "id": f"toolu_{i:03}",
            "name": "shell",
            "input": {"command": "x" * 900},
        }
        for i in range(40)
    ]
    state.add("model_reply", "calls", {"message": Message.assistant(calls).to_dict()})
    for block in calls:
        state.add(
            "approval_request", "asks", {"call_id": block["id"], "name": "shell", "input": {}}
        )
    message = termination_message(
        outcome="waiting_for_approval",
        state_id="big",
        state=state,
        error="e" * 5000,
        aborted=[f"toolu_{i}" for i in range(300)],
    )
    assert len(json.dumps(message, ensure_ascii=False).encode()) <= TERMINATION_MESSAGE_LIMIT
    assert message["truncated"] is True
    assert message["pendingApprovals"][0]["callId"] == "toolu_000"


def test_the_json_log_has_one_object_per_step(
    workspace: Workspace, model_server: ModelServer
) -> None:
    model_server.add(reply(tool_use("shell", {"command": "echo hi"})), reply("Done."))
    runner = workspace.run(
        workspace.manifest(prompt="Go.", tools=["shell"]), ALPINEAGENTS_LOG_FORMAT="json"
    )
    assert runner.process.returncode == 0, runner.stderr
    lines = [json.loads(line) for line in runner.stderr.splitlines()]
    events = [line["event"] for line in lines]
    assert events[0] == "start" and events[-1] == "exit"
    assert {"think", "tool", "save", "stop"} <= set(events)
    (tool_line,) = [line for line in lines if line["event"] == "tool"]
    assert (tool_line["tool"], tool_line["outcome"]) == ("shell", "ok")
    assert lines[-1]["exitCode"] == 0
    saved_seqs = [line["seq"] for line in lines if "seq" in line]
    assert saved_seqs == sorted(set(saved_seqs))  # each entry logged once, in order


def test_the_text_log_says_what_each_step_did(
    workspace: Workspace, model_server: ModelServer
) -> None:
    model_server.add(reply(tool_use("shell", {"command": "echo hi"})), reply("Done."))
    runner = workspace.run(workspace.manifest(prompt="Go.", tools=["shell"]))
    lines = runner.stderr.splitlines()
    steps = [line.split(" ", 2)[1:] for line in lines]
    assert ["think", "claude-sonnet-5 calls shell"] in steps
    assert any(s[0] == "tool" and s[1].startswith("shell ok exit code 0") for s in steps)
    assert ["save", "seq 0"] in steps
    assert steps[-1] == ["exit", "answered (exit 0)"]


# ---------------------------------------------------------------------------- pod mode


def test_pod_mode_reads_spec_store_and_id_from_the_environment(
    workspace: Workspace, model_server: ModelServer, runners: list[RunnerProcess]
) -> None:
    model_server.add(reply("From the pod."))
    runner = RunnerProcess(
        ["run"],
        workdir=workspace.work,
        env=child_env(
            model_server,
            ALPINEAGENTS_SPEC=json.dumps({"model": "claude-sonnet-5", "prompt": "Hi."}),
            ALPINEAGENTS_STORE=f"file://{workspace.runs}",
            ALPINEAGENTS_STATE_ID="default.job-7",
        ),
    )
    runners.append(runner)
    assert runner.wait() == 0, runner.stderr
    assert runner.message["stateId"] == "default.job-7"
    assert workspace.store.load("default.job-7").answer == "From the pod."


def test_pod_mode_reads_a_spec_too_long_for_the_environment_from_its_file(
    workspace: Workspace, model_server: ModelServer, runners: list[RunnerProcess]
) -> None:
    # exec refuses one variable over 128 KiB: this prompt could never start in ALPINEAGENTS_SPEC.
    prompt = "Summarise this. " + "lorem ipsum " * (200 * 1024 // 12)
    spec_file = workspace.work / "spec.json"
    spec_file.write_text(json.dumps({"model": "claude-sonnet-5", "prompt": prompt}))
    model_server.add(reply("Summarised."))
    runner = RunnerProcess(
        ["run"],
        workdir=workspace.work,
        env=child_env(
            model_server,
            ALPINEAGENTS_SPEC_FILE=str(spec_file),
            ALPINEAGENTS_STORE=f"file://{workspace.runs}",
            ALPINEAGENTS_STATE_ID="default.long-prompt",
        ),
    )
    runners.append(runner)
    assert runner.wait() == 0, runner.stderr
    state = workspace.store.load("default.long-prompt")
    assert state.answer == "Summarised."
    assert state.messages[0].text == prompt


def test_a_store_url_holding_a_password_is_refused_without_repeating_it() -> None:
    from alpineagents.runner import open_run_store

    for url in ("s3://AKIA1:topsecret@runs/x?endpoint=127.0.0.1:1", "ftp://me:topsecret@x/y"):
        with pytest.raises(SpecError) as refused:
            open_run_store(url, {})
        assert "topsecret" not in str(refused.value)
        assert "***@" in str(refused.value)


def test_pod_mode_with_an_unreadable_spec_file_exits_65_naming_it(
    workspace: Workspace, runners: list[RunnerProcess]
) -> None:
    missing = workspace.work / "no-such-spec.json"
    runner = RunnerProcess(
        ["run"],
        workdir=workspace.work,
        env=child_env(
            None,
            ALPINEAGENTS_SPEC_FILE=str(missing),
            ALPINEAGENTS_STORE=f"file://{workspace.runs}",
            ALPINEAGENTS_STATE_ID="default.no-spec",
        ),
    )
    runners.append(runner)
    assert runner.wait() == 65
    assert f"ALPINEAGENTS_SPEC_FILE ({missing})" in runner.message["error"]
    assert "cannot be read" in runner.message["error"]


# ---------------------------------------------------------------------------- agent factories


def test_the_agent_field_runs_a_user_factory(
    workspace: Workspace, model_server: ModelServer
) -> None:
    model_server.add(
        reply(tool_use("add_note", {"text": "buy milk"})),
        reply("Noted."),
    )
    manifest = workspace.manifest(
        prompt="Remember to buy milk.",
        agent="notes_agent:make_agent",
        notesSystem="You are the test's notes agent.",
        maxTurns=3,
    )
    runner = workspace.run(manifest, PYTHONPATH=with_examples())
    assert runner.process.returncode == 0, runner.stderr
    assert runner.message["answer"] == "Noted."
    assert json.loads((workspace.work / "notes.jsonl").read_text()) == {"text": "buy milk"}
    first = model_server.requests[0].body
    # The factory got the spec (the system prompt goes as a block, to carry its cache mark).
    assert [block["text"] for block in first["system"]] == ["You are the test's notes agent."]
    assert {t["name"] for t in first["tools"]} == {"add_note", "list_notes"}


def test_a_factory_agent_gets_the_specs_tools_and_approvals(
    workspace: Workspace, model_server: ModelServer
) -> None:
    model_server.add(reply(tool_use("add_note", {"text": "x"}, id="toolu_note")))
    manifest = workspace.manifest(
        prompt="Note x.",
        agent="notes_agent:make_agent",
        tools=["read_file"],
        requireApproval=["add_note"],
    )
    runner = workspace.run(manifest, PYTHONPATH=with_examples())
    assert runner.process.returncode == 76, runner.stderr
    assert [p["callId"] for p in runner.message["pendingApprovals"]] == ["toolu_note"]
    tools = {t["name"] for t in model_server.requests[0].body["tools"]}
    assert tools == {"add_note", "list_notes", "read_file"}


def test_a_factory_that_returns_something_else_exits_65(workspace: Workspace) -> None:
    module = workspace.work / "wrong_factory.py"
    module.write_text("def make():\n    return 'not an agent'\n")
    runner = workspace.run(workspace.manifest(prompt="hi", agent="wrong_factory:make"))
    assert runner.process.returncode == 65
    assert runner.message["error"] == (
        "spec.agent: wrong_factory:make returned str, not an alpineagents.Agent"
    )


# ---------------------------------------------------------------------------- spec parsing


def test_parse_spec_reads_messages_and_warns_about_misspelt_fields_in_a_pod() -> None:
    plan = parse_spec(
        {
            "model": "claude-sonnet-5",
            "messages": [{"role": "user", "content": "a"}, {"role": "assistant", "content": "b"}],
            "maxturns": 3,
            "image": "ours:1",  # the operator's field: no warning
        }
    )
    assert [m.role for m in plan.messages] == ["user", "assistant"]
    assert plan.max_turns is None
    assert plan.warnings == ("spec.maxturns: not a field of an AgentRun; did you mean maxTurns?",)
    with pytest.raises(SpecError, match=r"spec\.messages\[0\]\.role"):
        parse_spec({"model": "m", "messages": [{"role": "system", "content": "x"}]})
    with pytest.raises(SpecError, match="either prompt or messages"):
        parse_spec({"model": "m", "prompt": "x", "messages": [{"role": "user", "content": "y"}]})


# ---------------------------------------------------------------------------- built-in tools


@pytest.fixture
def tools(tmp_path: Path) -> dict[str, Any]:
    work = tmp_path / "work"
    work.mkdir()
    (tmp_path / "secret.txt").write_text("outside\n")
    made = builtin_tools.make_tools(builtin_tools.NAMES, workdir=work)
    return {t.name: t for t in made} | {"work": work}


def test_make_tools_refuses_unknown_names(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="unknown tool 'shel'; built-in tools are: fetch_url"):
        builtin_tools.make_tools(["shel"], workdir=tmp_path)


def test_read_and_write_stay_inside_the_working_directory(tools: dict[str, Any]) -> None:
    work: Path = tools["work"]
    read, write = tools["read_file"], tools["write_file"]
    assert write(path="notes/a.txt", content="hello\n") == "wrote 6 bytes to notes/a.txt"
    assert read(path="notes/a.txt") == "hello\n"
    assert read(path=str(work / "notes" / "a.txt")) == "hello\n"  # absolute, but inside
    (work / "inner-link").symlink_to(work / "notes" / "a.txt")
    assert read(path="inner-link") == "hello\n"

    (work / "escape").symlink_to(work.parent / "secret.txt")
    (work / "escape-dir").symlink_to(work.parent)
    for path in (
        "../secret.txt",
        str(work.parent / "secret.txt"),
        "escape",
        "escape-dir/secret.txt",
        "notes/../../secret.txt",
    ):
        with pytest.raises(builtin_tools.ToolFailed, match="outside the working directory"):
            read(path=path)
        with pytest.raises(builtin_tools.ToolFailed, match="outside the working directory"):
            write(path=path, content="overwritten")
    assert (work.parent / "secret.txt").read_text() == "outside\n"  # fmt: skip


def test_file_tools_have_size_limits(tools: dict[str, Any]) -> None:
    work: Path = tools["work"]
    with pytest.raises(builtin_tools.ToolFailed, match="at most"):
        tools["write_file"](path="big.txt", content="x" * (builtin_tools.WRITE_LIMIT + 1))
    (work / "big.txt").write_text("y" * (builtin_tools.READ_LIMIT + 10))
    first = tools["read_file"](path="big.txt")
    assert first.startswith("y" * builtin_tools.READ_LIMIT)
    assert f"read on with offset={builtin_tools.READ_LIMIT}" in first
    assert tools["read_file"](path="big.txt", offset=builtin_tools.READ_LIMIT) == "y" * 10
    (work / "blob").write_bytes(b"\0\1\2")
    with pytest.raises(builtin_tools.ToolFailed, match="binary"):
        tools["read_file"](path="blob")


def test_shell_runs_in_the_working_directory_with_limits(
    tools: dict[str, Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    shell = tools["shell"]
    monkeypatch.setenv("ANTHROPIC_API_KEY", "sk-secret")
    monkeypatch.setenv("ALPINEAGENTS_MCP_CALC_HEADER_AUTHORIZATION", "Bearer s3cret")
    assert shell(
        command="pwd; echo ${ANTHROPIC_API_KEY:-no key} ${ALPINEAGENTS_MCP_CALC_HEADER_AUTHORIZATION:-no header}"
    ) == (f"exit code 0\n{tools['work']}\nno key no header\n")
    with pytest.raises(builtin_tools.ToolFailed, match="exit code 3\noops"):
        shell(command="echo oops; exit 3")
    with pytest.raises(builtin_tools.ToolFailed, match=r"timed out after 0\.5s"):
        shell(command="sleep 30", timeout=0.5)
    long = shell(command=f"head -c {builtin_tools.OUTPUT_LIMIT * 2} /dev/zero | tr '\\0' a")
    assert "characters cut" in long
    assert len(long) < builtin_tools.OUTPUT_LIMIT + 100


def test_fetch_url_fetches_with_limits(tools: dict[str, Any]) -> None:
    class Pages(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            status, body = {"/ok": (200, b"fine"), "/big": (200, b"z" * (2 << 20))}.get(
                self.path, (404, b"no such page")
            )
            self.send_response(status)
            self.send_header("content-type", "text/plain; charset=utf-8")
            self.send_header("content-length", str(len(body)))
            self.end_headers()
            with contextlib.suppress(BrokenPipeError, ConnectionResetError):
                self.wfile.write(body)

        def log_message(self, format: str, *args: Any) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Pages)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    base = f"http://127.0.0.1:{server.server_address[1]}"
    try:
        fetch = tools["fetch_url"]
        assert fetch(url=f"{base}/ok") == f"HTTP 200 {base}/ok (text/plain; charset=utf-8)\nfine"
        with pytest.raises(builtin_tools.ToolFailed, match="HTTP 404"):
            fetch(url=f"{base}/missing")
        big = fetch(url=f"{base}/big")
        assert f"only the first {builtin_tools.FETCH_MAX_BYTES} bytes were read" in big
        with pytest.raises(builtin_tools.ToolFailed, match="not an http or https URL"):
            fetch(url="file:///etc/passwd")
    finally:
        server.shutdown()
        server.server_close()
        thread.join()


def test_a_read_outside_the_working_directory_is_an_error_result_in_a_run(
    workspace: Workspace, model_server: ModelServer
) -> None:
    (workspace.root / "secret.txt").write_text("the secret")
    model_server.add(reply(tool_use("read_file", {"path": "../secret.txt"})), reply("Cannot."))
    runner = workspace.run(workspace.manifest(prompt="Read it.", tools=["read_file"]))
    assert runner.process.returncode == 0, runner.stderr
    (result,) = tool_results(workspace.store.load("job"))
    assert result.outcome == "error"
    assert "outside the working directory" in result.text
    assert "the secret" not in json.dumps(model_server.requests[-1].body)
