"""The ``alpineagents`` command line as a user types it: real processes and stores."""

from __future__ import annotations

import json
import shutil
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

from alpineagents import FileStore, Message, State
from alpineagents.runner import ExitCode
from alpineagents.testing import ModelServer, hold, reply, tool_use
from tests.bench.infra import free_port
from tests.bench.runner_process import (
    BLOCKING,
    DEADLINE,
    REPO,
    RunnerProcess,
    Workspace,
    child_env,
    last_tool_result_block,
    tool_results,
    wait_for_file,
)


def cli(
    *args: str, workdir: Path, env: dict[str, str], runners: list[RunnerProcess]
) -> RunnerProcess:
    """``python -m alpineagents ARGS``, run to its end."""
    process = RunnerProcess(list(args), workdir=workdir, env=env)
    runners.append(process)
    process.wait()
    return process


# ---------------------------------------------------------------------------- run


def test_the_offline_demo_runs_hello_yaml_to_an_answer(
    tmp_path: Path, runners: list[RunnerProcess]
) -> None:
    command = shutil.which("alpineagents")
    assert command is not None, "pip install -e . installs the alpineagents command"
    env = child_env(None)
    store = str(tmp_path / "runs")
    args = [command, "run", "examples/hello.yaml", "--offline", "--store", store]
    first = subprocess.run(
        args, cwd=REPO, env=env, capture_output=True, text=True, timeout=DEADLINE
    )
    assert first.returncode == 0, first.stderr
    assert first.stdout.startswith("read_file returned: # The smallest AgentRun.")
    assert " tool read_file ok " in first.stderr
    assert first.stderr.splitlines()[-1].endswith("exit answered (exit 0)")

    again = subprocess.run(
        args, cwd=REPO, env=env, capture_output=True, text=True, timeout=DEADLINE
    )
    assert again.returncode == 0, again.stderr
    assert again.stdout == first.stdout
    assert " resume hello at seq 7 (answered, 2 turns)" in again.stderr


def test_ctrl_c_stops_cleanly_and_a_second_run_resumes(
    workspace: Workspace, model_server: ModelServer, leftover_commands: list[int]
) -> None:
    model_server.add(reply(tool_use("shell", {"command": BLOCKING}, id="toolu_long")))
    manifest = workspace.manifest(prompt="Run it.", tools=["shell"])
    runner = workspace.start(manifest)
    leftover_commands.append(int(wait_for_file(workspace.work / "started")))
    runner.signal(signal.SIGINT)
    assert runner.wait() == ExitCode.INTERRUPTED == 130
    assert runner.message["outcome"] == "stopped"
    assert "Traceback" not in runner.stderr
    (result,) = tool_results(workspace.store.load("job"))
    assert result.text == "(aborted: KeyboardInterrupt)"

    model_server.add(reply("Stopped by you; not running it again."))
    again = workspace.run(manifest)
    assert again.process.returncode == 0, again.stderr
    assert again.stdout.strip() == "Stopped by you; not running it again."


def test_an_edited_prompt_under_an_existing_id_warns_how_to_start_anew(
    workspace: Workspace, model_server: ModelServer
) -> None:
    model_server.add(reply("Bern is sunny."))
    assert workspace.run(workspace.manifest(prompt="Weather in Bern?")).process.returncode == 0
    same = workspace.run(workspace.manifest(prompt="Weather in Bern?"))
    assert " warning " not in same.stderr

    edited = workspace.run(workspace.manifest(prompt="Weather in Zurich?"))
    assert edited.process.returncode == 0
    assert edited.stdout.strip() == "Bern is sunny."  # the saved State, as the warning says
    (warning,) = [line for line in edited.stderr.splitlines() if " warning " in line]
    assert warning.endswith(
        "warning the spec's prompt is not the one job began with ('Weather in Bern?'): this "
        "resumes the saved State and its prompt; to start anew, alpineagents delete job, or "
        "run with --id NEW-ID"
    )
    assert len(model_server.requests) == 1


# ---------------------------------------------------------------------------- list, show, tail, delete


def test_list_show_and_delete_a_file_store(
    workspace: Workspace, model_server: ModelServer, runners: list[RunnerProcess]
) -> None:
    model_server.add(reply(tool_use("shell", {"command": "echo hi"})), reply("First done."))
    assert (
        workspace.run(
            workspace.manifest("first", prompt="One.", tools=["shell"])
        ).process.returncode
        == 0
    )
    model_server.add(reply(tool_use("shell", {"command": "true"}, id="toolu_w")))
    spec: dict[str, Any] = {"prompt": "Two.", "tools": ["shell"], "requireApproval": ["shell"]}
    assert workspace.run(workspace.manifest("second", **spec)).process.returncode == 76

    store = f"file://{workspace.runs}"
    env = child_env(None)
    listed = cli("list", "--store", store, workdir=workspace.work, env=env, runners=runners)
    assert listed.process.returncode == 0, listed.stderr
    rows = [line.split() for line in listed.stdout.splitlines()]
    assert [(r[0], r[3]) for r in rows] == [
        ("second", "waiting_for_approval"),
        ("first", "answered"),
    ]

    shown = cli("show", "first", "--store", store, workdir=workspace.work, env=env, runners=runners)
    assert shown.process.returncode == 0, shown.stderr
    header, *lines = shown.stdout.splitlines()
    assert header.startswith("first: 7 entries, answered, turns 2")
    assert [line.split()[0] for line in lines] == [str(n) for n in range(7)]
    assert lines[3].split(maxsplit=2)[2].startswith("tool shell ok exit code 0 hi")
    assert lines[-1].endswith("stop answered")

    as_json = cli(
        "show", "first", "--store", store, "--log-format", "json",
        workdir=workspace.work, env=env, runners=runners,
    )  # fmt: skip
    entries = [json.loads(line) for line in as_json.stdout.splitlines()]
    assert [e["seq"] for e in entries] == list(range(7))
    assert entries[3]["outcome"] == "ok"

    deleted = cli(
        "delete", "first", "--store", store, workdir=workspace.work, env=env, runners=runners
    )
    assert deleted.process.returncode == 0, deleted.stderr
    assert FileStore(workspace.runs).read("first") is None
    assert [s.id for s in FileStore(workspace.runs).list()] == ["second"]


def test_tail_follows_a_running_state_until_it_stops(
    workspace: Workspace, model_server: ModelServer, runners: list[RunnerProcess]
) -> None:
    model_server.add(hold(reply("Finally.")))
    run = workspace.start(workspace.manifest(prompt="Take your time."))
    model_server.wait_for_requests(1)  # the request is saved before it is sent

    tail = RunnerProcess(
        ["tail", "job", "--store", str(workspace.runs), "--interval", "0.05"],
        workdir=workspace.work,
        env=child_env(None),
    )
    runners.append(tail)
    assert tail.process.stdout is not None
    seen = [tail.process.stdout.readline() for _ in range(2)]
    assert "message user: Take your time." in seen[0]
    assert "think asking claude-sonnet-5" in seen[1]
    assert tail.process.poll() is None  # still following

    model_server.release()
    assert tail.wait() == 0, tail.stderr
    rest = tail.stdout.splitlines()
    assert rest[0].split(maxsplit=2)[2] == "think claude-sonnet-5: Finally."
    assert rest[-1].endswith("stop answered")
    assert run.wait() == 0


def test_tail_says_lost_when_the_process_running_the_state_is_killed(
    workspace: Workspace, model_server: ModelServer, runners: list[RunnerProcess]
) -> None:
    model_server.add(hold(reply("Never sent.")))
    run = workspace.start(workspace.manifest(prompt="Take your time."))
    model_server.wait_for_requests(1)

    # A second run of the same State while the first runs would write over its history.
    second = workspace.run(workspace.manifest(prompt="Take your time."))
    assert second.process.returncode == ExitCode.RETRYABLE, second.stderr
    assert second.message["error"] == (
        f"job is being run by another process (pid {run.process.pid}): wait for it to end, "
        f"or stop it"
    )

    tail = RunnerProcess(
        ["tail", "job", "--store", str(workspace.runs), "--interval", "0.05"],
        workdir=workspace.work,
        env=child_env(None),
        message_path=workspace.root / "tail-termination-log",
    )
    runners.append(tail)
    assert tail.process.stdout is not None
    assert "message user: Take your time." in tail.process.stdout.readline()
    store, env = str(workspace.runs), child_env(None)

    def said(command: str) -> str:
        done = cli(command, *(["job"] if command == "show" else []), "--store", store,
                   workdir=workspace.work, env=env, runners=runners)  # fmt: skip
        return done.stdout.splitlines()[0]

    assert said("list").split()[3] == "running" and ", running, " in said("show")
    run.signal(signal.SIGKILL)
    assert run.wait() == -signal.SIGKILL
    assert tail.wait() == 1
    assert tail.stderr == (
        "alpineagents: no process runs job (lost, or waiting to be run again): "
        "alpineagents run resumes it\n"
    )
    # list and show tell a killed run from a running one, as tail and the viewer do.
    assert said("list").split()[3] == "lost" and ", lost, " in said("show")
    model_server.release()


def test_tail_of_a_stopped_state_prints_its_last_entries_and_exits(
    workspace: Workspace, model_server: ModelServer, runners: list[RunnerProcess]
) -> None:
    model_server.add(reply("Done."))
    assert workspace.run(workspace.manifest(prompt="Hi.")).process.returncode == 0
    tail = cli(
        "tail", "job", "-n", "2", "--store", str(workspace.runs),
        workdir=workspace.work, env=child_env(None), runners=runners,
    )  # fmt: skip
    assert tail.process.returncode == 0
    assert [line.split()[0] for line in tail.stdout.splitlines()] == ["2", "3"]


# ---------------------------------------------------------------------------- approvals


def test_an_offline_run_waiting_for_approval_hints_the_offline_command_that_works(
    workspace: Workspace, runners: list[RunnerProcess]
) -> None:
    manifest = workspace.manifest(
        prompt='Deploy.\nuse shell {"command": "echo deployed"}',
        tools=["shell"],
        requireApproval=["shell"],
    )
    store, env = str(workspace.runs), child_env(None)
    run = ["run", manifest, "--offline", "--store", store]
    first = cli(*run, workdir=workspace.work, env=env, runners=runners)
    assert first.process.returncode == ExitCode.WAITING_FOR_APPROVAL, first.stderr
    approve, then = first.stderr.splitlines()[-2:]
    assert then == f"then: alpineagents run {manifest} --offline --store {store}"
    # Both followed as printed: no API key needed.
    approving = approve.split("(or")[0].split()[2:]
    approved = cli(*approving, workdir=workspace.work, env=env, runners=runners)
    assert approved.process.returncode == 0, approved.stderr
    second = cli(*then.split()[2:], workdir=workspace.work, env=env, runners=runners)
    assert second.process.returncode == 0, second.stderr
    assert "deployed" in second.stdout


@pytest.mark.parametrize("refuse", [False, True])
def test_a_run_that_waits_for_approval_says_how_to_answer_and_approve_answers(
    workspace: Workspace, model_server: ModelServer, runners: list[RunnerProcess], refuse: bool
) -> None:
    model_server.add(reply(tool_use("shell", {"command": "touch deployed"}, id="toolu_w")))
    manifest = workspace.manifest(prompt="Deploy.", tools=["shell"], requireApproval=["shell"])
    first = workspace.run(manifest)
    assert first.process.returncode == ExitCode.WAITING_FOR_APPROVAL == 76, first.stderr
    *_, exit_line, step, then = first.stderr.splitlines()
    assert exit_line.endswith("exit waiting_for_approval (exit 76): toolu_w (shell)")
    assert step.startswith(f"next: alpineagents approve job toolu_w --store {workspace.runs}")
    assert then == f"then: alpineagents run {manifest} --store {workspace.runs}"

    store, env = str(workspace.runs), child_env(None)
    shown = cli("show", "job", "--store", store, workdir=workspace.work, env=env, runners=runners)
    assert "approval asks a person: shell" in shown.stdout
    assert shown.stdout.splitlines()[-2].endswith("[call toolu_w]")

    wrong = cli(
        "approve",
        "job",
        "toolu_x",
        "--store",
        store,
        workdir=workspace.work,
        env=env,
        runners=runners,
    )
    assert wrong.process.returncode == 1
    assert wrong.stderr == (
        "alpineagents: toolu_x: not a call job waits on; it waits on toolu_w "
        "(alpineagents show job lists them)\n"
    )
    answer = ["--refuse", "--reason", "not on a Friday"] if refuse else []
    approved = cli(
        "approve", "job", "toolu_w", *answer, "--store", store,
        workdir=workspace.work, env=env, runners=runners,
    )  # fmt: skip
    assert approved.process.returncode == 0, approved.stderr
    word = "refused" if refuse else "allowed"
    assert approved.stderr == f"{word} toolu_w in job: run the manifest again to go on\n"
    again = cli(
        "approve",
        "job",
        "toolu_w",
        "--store",
        store,
        workdir=workspace.work,
        env=env,
        runners=runners,
    )
    assert again.process.returncode == 1
    assert "its calls have their answers: run the manifest again" in again.stderr

    model_server.add(reply("Done."))
    resumed = workspace.run(manifest)
    assert resumed.process.returncode == 0, resumed.stderr
    assert "resume job at seq 6 (answered by a person, 1 turn)" in resumed.stderr
    result = last_tool_result_block(model_server.requests[-1].body)
    assert (workspace.work / "deployed").exists() is not refuse
    assert (result.get("is_error") is True) is refuse
    if refuse:
        history = cli(
            "show", "job", "--store", store, workdir=workspace.work, env=env, runners=runners
        )
        assert "approval a person refused shell: not on a Friday [call toolu_w]" in history.stdout


# ---------------------------------------------------------------------------- mistakes


@pytest.mark.parametrize(
    ("args", "code", "expected"),
    [
        (["run", "bad.yaml"], 65, "bad.yaml: not valid YAML: expected ',' or ']', but got '<stream end>' (line 5, column 1)"),
        (["run", "missing.yaml"], 65, "missing.yaml: cannot read it: No such file or directory"),
        (["run", "ok.yaml"], 65, "ANTHROPIC_API_KEY is not set: export your API key, or run with --offline"),
        (["run", "ok.yaml", "--store", "ftp://somewhere/runs"], 65, "store: ftp://somewhere/runs: "),
        (["list", "--store", "ftp://somewhere/runs"], 65, "alpineagents: store: ftp://somewhere/runs: "),
        (["list", "--store", "runz"], 1, "alpineagents: the store folder 'runz' does not exist (check --store"),
        (["show", "job", "--store", "runz"], 1, "alpineagents: the store folder 'runz' does not exist"),
        (["show", "damaged"], 65, "alpineagents: State 'damaged' in FileStore('.agent-runs') is damaged: "),
        (["show", "nope"], 1, "alpineagents: no saved State 'nope' in FileStore("),
        (["tail", "nope"], 1, "alpineagents: no saved State 'nope' in FileStore("),
        (["delete", "nope"], 1, "alpineagents: no saved State 'nope' in FileStore("),
    ],
)  # fmt: skip
def test_a_user_mistake_is_one_line_on_stderr(
    tmp_path: Path, runners: list[RunnerProcess], args: list[str], code: int, expected: str
) -> None:
    (tmp_path / "bad.yaml").write_text(
        "apiVersion: alpineagents.dev/v1\nkind: AgentRun\nspec:\n  tools: [shell\n"
    )
    (tmp_path / "ok.yaml").write_text(
        "apiVersion: alpineagents.dev/v1\nkind: AgentRun\nmetadata: {name: ok}\n"
        "spec: {model: claude-sonnet-5, prompt: hi}\n"
    )
    (tmp_path / "runs").mkdir()
    damaged = tmp_path / ".agent-runs" / "damaged"
    damaged.mkdir(parents=True)
    (damaged / "info.json").write_text("garbage")
    (damaged / "history.jsonl").write_text("")
    result = cli(*args, workdir=tmp_path, env=child_env(None), runners=runners)
    assert result.process.returncode == code
    lines = result.stderr.splitlines()
    assert len(lines) == 1, result.stderr
    assert expected in lines[0]
    assert "Error:" not in lines[0]  # a user is told what is wrong, not a Python class
    assert result.stdout == ""


@pytest.mark.parametrize(
    ("field", "expected"),
    [
        ("requireApprovals", "spec.requireApprovals: not a field of an AgentRun; did you mean requireApproval?"),
        ("require_approval", "spec.require_approval: not a field of an AgentRun; did you mean requireApproval?"),
        ("tool", "spec.tool: not a field of an AgentRun; did you mean tools?"),
        ("xyzzy", "spec.xyzzy: not a field of an AgentRun; its fields are: model, prompt,"),
    ],
)  # fmt: skip
def test_a_misspelt_field_in_a_manifest_stops_the_run_before_anything_runs(
    workspace: Workspace, model_server: ModelServer, field: str, expected: str
) -> None:
    # A misspelt safety field must not run shell unasked: exit 65 before the model is asked.
    manifest = workspace.manifest(prompt="Clean up.", tools=["shell"], **{field: ["shell"]})
    runner = workspace.run(manifest)
    assert runner.process.returncode == ExitCode.NOT_RETRYABLE == 65, runner.stderr
    assert expected in runner.message["error"]
    assert expected in runner.stderr
    assert model_server.requests == []
    assert workspace.store.read("job") is None


def test_the_known_fields_are_the_crds() -> None:
    from alpineagents.runner import spec

    crd = yaml.safe_load((REPO / "crds" / "agentrun.yaml").read_text())
    schema = crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"]
    assert set(spec._FIELDS) == set(schema["properties"])


def test_list_into_head_stops_quietly(tmp_path: Path) -> None:
    store = FileStore(tmp_path / "runs")
    for n in range(1500):  # more than a pipe holds, so list is still writing when head leaves
        store.save(State(f"run-{n:04}", [Message.user(f"Prompt number {n} " + "x" * 60)]))
    listed = subprocess.Popen(
        [sys.executable, "-m", "alpineagents", "list", "--store", str(store.folder)],
        env=child_env(None),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    assert listed.stdout is not None and listed.stderr is not None
    assert listed.stdout.readline().startswith("run-")
    listed.stdout.close()  # what head does after its lines
    stderr = listed.stderr.read()
    assert listed.wait(DEADLINE) == 128 + signal.SIGPIPE
    assert stderr == ""


def test_an_s3_store_without_the_minio_extra_names_the_extra(
    tmp_path: Path, runners: list[RunnerProcess]
) -> None:
    # As if minio were installed without one of its own dependencies (or not at all).
    shadow = tmp_path / "shadow" / "minio"
    shadow.mkdir(parents=True)
    (shadow / "__init__.py").write_text(
        "raise ModuleNotFoundError(\"No module named 'urllib3'\", name='urllib3')\n"
    )
    env = child_env(
        None,
        PYTHONPATH=f"{tmp_path / 'shadow'}:{REPO / 'operator'}",
        AWS_ACCESS_KEY_ID="minioadmin",
        AWS_SECRET_ACCESS_KEY="minioadmin",
    )
    url = "s3://runs/team?endpoint=127.0.0.1:9&secure=false"
    listed = cli("list", "--store", url, workdir=tmp_path, env=env, runners=runners)
    assert listed.process.returncode == ExitCode.NOT_RETRYABLE == 65
    assert listed.stderr == (
        f"alpineagents: store: {url} needs the minio extra (urllib3 is missing): "
        f"pip install 'alpineagents[minio]'\n"
    )


def test_python_dash_m_is_the_same_command(tmp_path: Path) -> None:
    shown = subprocess.run(
        [sys.executable, "-m", "alpineagents", "--help"],
        capture_output=True,
        text=True,
        timeout=DEADLINE,
    )
    assert shown.returncode == 0
    for command in ("run", "list", "show", "tail", "delete"):
        assert command in shown.stdout


# ---------------------------------------------------------------------------- S3


def test_run_list_show_tail_and_delete_on_s3(
    workspace: Workspace, model_server: ModelServer, runners: list[RunnerProcess], minio: Any
) -> None:
    url = f"s3://{minio.bucket}/{minio.unique_prefix()}?endpoint={minio.endpoint}&secure=false"
    credentials = {"AWS_ACCESS_KEY_ID": minio.access_key, "AWS_SECRET_ACCESS_KEY": minio.secret_key}
    model_server.add(reply(tool_use("shell", {"command": "echo on s3"})), reply("Saved in S3."))
    run = RunnerProcess(
        ["run", workspace.manifest(prompt="Go.", tools=["shell"]), "--store", url],
        workdir=workspace.work,
        env=child_env(model_server, **credentials),
    )
    runners.append(run)
    assert run.wait() == 0, run.stderr
    assert run.stdout.strip() == "Saved in S3."

    env = child_env(None, **credentials)
    listed = cli("list", "--store", url, workdir=workspace.work, env=env, runners=runners)
    assert listed.process.returncode == 0, listed.stderr
    assert [line.split()[0] for line in listed.stdout.splitlines()] == ["job"]
    shown = cli("show", "job", "--store", url, workdir=workspace.work, env=env, runners=runners)
    assert "tool shell ok exit code 0 on s3" in shown.stdout
    tail = cli("tail", "job", "--store", url, workdir=workspace.work, env=env, runners=runners)
    assert tail.stdout.splitlines()[-1].endswith("stop answered")

    again = RunnerProcess(
        ["run", workspace.manifest(prompt="Go.", tools=["shell"]), "--store", url],
        workdir=workspace.work,
        env=child_env(model_server, **credentials),
    )
    runners.append(again)
    asked = len(model_server.requests)
    assert again.wait() == 0
    assert len(model_server.requests) == asked

    deleted = cli("delete", "job", "--store", url, workdir=workspace.work, env=env, runners=runners)
    assert deleted.process.returncode == 0, deleted.stderr
    gone = cli("show", "job", "--store", url, workdir=workspace.work, env=env, runners=runners)
    assert gone.process.returncode == 1


def test_a_second_run_of_a_state_on_s3_takes_it_over_and_the_first_exits_75(
    workspace: Workspace, model_server: ModelServer, runners: list[RunnerProcess], minio: Any
) -> None:
    # No lock spans machines: on S3 the newer run claims the State, as a replacement pod
    # does, and the older one is fenced off it, writing nothing more.
    url = f"s3://{minio.bucket}/{minio.unique_prefix()}?endpoint={minio.endpoint}&secure=false"
    credentials = {"AWS_ACCESS_KEY_ID": minio.access_key, "AWS_SECRET_ACCESS_KEY": minio.secret_key}
    model_server.add(hold(reply("From the first run.")), reply("From the second run."))
    command = ["run", workspace.manifest(prompt="Take your time."), "--store", url]
    first = RunnerProcess(
        command, workdir=workspace.work, env=child_env(model_server, **credentials)
    )
    runners.append(first)
    model_server.wait_for_requests(1)

    second = RunnerProcess(
        command, workdir=workspace.work, env=child_env(model_server, **credentials)
    )
    runners.append(second)
    assert second.wait() == 0, second.stderr
    assert second.stdout.strip() == "From the second run."

    model_server.release()
    assert first.wait() == ExitCode.RETRYABLE, first.stderr
    assert first.message["error"].startswith("StateFencedError: State 'job' in MinioStore(")
    env = child_env(None, **credentials)
    shown = cli("show", "job", "--store", url, workdir=workspace.work, env=env, runners=runners)
    assert "From the second run." in shown.stdout
    assert "From the first run." not in shown.stdout


def test_an_s3_store_that_does_not_answer_exits_75(
    workspace: Workspace, model_server: ModelServer, runners: list[RunnerProcess], minio: Any
) -> None:
    closed = f"127.0.0.1:{free_port()}"
    url = f"s3://{minio.bucket}/x?endpoint={closed}&secure=false&retry_budget=1&timeout=0.5"
    credentials = {"AWS_ACCESS_KEY_ID": minio.access_key, "AWS_SECRET_ACCESS_KEY": minio.secret_key}
    run = RunnerProcess(
        ["run", workspace.manifest(prompt="Go."), "--store", url],
        workdir=workspace.work,
        env=child_env(model_server, **credentials),
    )
    runners.append(run)
    assert run.wait() == ExitCode.RETRYABLE, run.stderr
    assert run.message["error"].startswith("store unavailable: ")
    assert model_server.requests == []

    listed = cli(
        "list",
        "--store",
        url,
        workdir=workspace.work,
        env=child_env(None, **credentials),
        runners=runners,
    )
    assert listed.process.returncode == ExitCode.RETRYABLE
    (line,) = listed.stderr.splitlines()
    assert line.startswith("alpineagents: store unavailable: MinioStore(")


def test_a_runs_lock_in_a_filestore_is_readable_only_by_its_owner(
    workspace: Workspace, model_server: ModelServer
) -> None:
    import stat

    model_server.add(reply("Hello."))
    assert workspace.run(workspace.manifest(prompt="Hi.")).process.returncode == 0
    running = workspace.runs / ".running"
    assert stat.S_IMODE(running.stat().st_mode) == 0o700
    locks = list(running.iterdir())
    assert locks and all(stat.S_IMODE(lock.stat().st_mode) == 0o600 for lock in locks)
