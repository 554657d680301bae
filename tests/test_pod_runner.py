"""The stand-in kubelet (tests/bench/pod_runner.py) on a real kube-apiserver.

The first tests are pure: the status a kubelet would write for given container states.
The rest create pods through the API and check what a user (or the operator) would see:
processes run, exit codes and termination messages are reported, signals are real, and
deletion, eviction, OOM kills and node loss look the way they do on a real node.
"""

from __future__ import annotations

import json
import os
import signal
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.bench.pod_runner import (
    ContainerView,
    PodFacts,
    PodRunner,
    Termination,
    build_pod_status,
    effective_grace_seconds,
    expand,
    pod_phase,
    read_termination_message,
    settle_terminated,
    wait_for_pod,
)

# ---- pure status building -------------------------------------------------------------

_T0 = "2026-01-01T00:00:00Z"


def _done(name: str, code: int, message: str = "") -> ContainerView:
    reason = "Completed" if code == 0 else "Error"
    term = Termination(code, reason, _T0, _T0, "local://1", message)
    return ContainerView(name, "img", waiting_reason=None, terminated=term)


def _running(name: str) -> ContainerView:
    return ContainerView(
        name, "img", waiting_reason=None, running_since=_T0, container_id="local://2"
    )


def test_phase_follows_the_kubelet_rules_for_each_restart_policy() -> None:
    waiting = ContainerView("a", "img")
    assert pod_phase("Never", [], [waiting]) == "Pending"
    assert pod_phase("Never", [], [_running("a"), _done("b", 0)]) == "Running"
    assert pod_phase("Never", [], [_done("a", 0), _done("b", 0)]) == "Succeeded"
    assert pod_phase("Never", [], [_done("a", 0), _done("b", 1)]) == "Failed"
    # Restarting containers keep the pod Running unless the pod is being torn down.
    assert pod_phase("OnFailure", [], [_done("a", 1)]) == "Running"
    assert pod_phase("Always", [], [_done("a", 0)]) == "Running"
    assert pod_phase("Always", [], [_done("a", 0)], terminal=True) == "Succeeded"
    assert pod_phase("Always", [], [_done("a", 143)], terminal=True) == "Failed"
    # Init containers gate everything; a failed one fails a Never pod outright.
    assert pod_phase("Never", [_running("i")], [waiting]) == "Pending"
    assert pod_phase("Never", [_done("i", 2)], [waiting]) == "Failed"
    assert pod_phase("OnFailure", [_done("i", 2)], [waiting]) == "Pending"


def test_status_of_a_finished_pod_reads_like_the_kubelets() -> None:
    facts = PodFacts(
        restart_policy="Never",
        init_containers=[_done("setup", 0)],
        containers=[_done("main", 0, "all done")],
        start_time=_T0,
        sandbox_ready=False,
    )
    status = build_pod_status(facts, now=_T0)
    assert status["phase"] == "Succeeded"
    conditions = {c["type"]: c for c in status["conditions"]}
    assert conditions["Ready"]["status"] == "False"
    assert conditions["Ready"]["reason"] == "PodCompleted"
    assert conditions["Initialized"]["status"] == "True"
    assert conditions["PodReadyToStartContainers"]["status"] == "False"
    (main,) = status["containerStatuses"]
    assert main["state"]["terminated"]["message"] == "all done"
    assert main["state"]["terminated"]["reason"] == "Completed"
    assert main["ready"] is False
    (setup,) = status["initContainerStatuses"]
    assert setup["ready"] is True  # a completed init container counts as ready


def test_status_names_unready_containers_and_keeps_transition_times() -> None:
    facts = PodFacts("Always", [], [_running("a"), ContainerView("b", "img")], _T0)
    first = build_pod_status(facts, now=_T0)
    ready = next(c for c in first["conditions"] if c["type"] == "Ready")
    assert ready["message"] == "containers with unready status: [b]"
    later = "2026-01-01T00:05:00Z"
    previous = {c["type"]: c for c in first["conditions"]}
    again = build_pod_status(facts, previous, now=later)
    assert all(c["lastTransitionTime"] == _T0 for c in again["conditions"])
    both = PodFacts("Always", [], [_running("a"), _running("b")], _T0)
    flipped = build_pod_status(both, previous, now=later)
    ready = next(c for c in flipped["conditions"] if c["type"] == "Ready")
    assert (ready["status"], ready["lastTransitionTime"]) == ("True", later)


def test_evicted_pod_status() -> None:
    facts = PodFacts(
        "Always", [], [_done("a", 137)], _T0, terminal=True, evicted_message="low on memory"
    )
    status = build_pod_status(facts, now=_T0)
    assert (status["phase"], status["reason"], status["message"]) == (
        "Failed",
        "Evicted",
        "low on memory",
    )
    disruption = next(c for c in status["conditions"] if c["type"] == "DisruptionTarget")
    assert disruption["reason"] == "TerminationByKubelet"


def test_a_terminated_pod_settles_every_container_like_the_kubelet() -> None:
    older = Termination(3, "Error", _T0, _T0, "local://1")
    last = Termination(2, "Error", _T0, _T0, "local://2")
    backoff = ContainerView(
        "a", "img", restart_count=2, waiting_reason="CrashLoopBackOff", last_terminated=last
    )
    settled = settle_terminated(backoff, older, initialized=True)
    assert (settled.terminated, settled.last_terminated) == (last, older)
    never = settle_terminated(ContainerView("b", "img"), None, initialized=True)
    assert never.terminated is not None
    assert (never.terminated.reason, never.terminated.exit_code) == ("ContainerStatusUnknown", 137)
    waiting = ContainerView("b", "img", waiting_reason="PodInitializing")
    assert settle_terminated(waiting, None, initialized=False) == waiting
    # A pod torn down before it ever ran ends Failed, never Pending.
    facts = PodFacts("Never", [ContainerView("i", "img")], [waiting], _T0, terminal=True)
    assert build_pod_status(facts)["phase"] == "Failed"


def test_variable_expansion_matches_kubernetes() -> None:
    variables = {"A": "1", "B": "two"}
    assert expand("$(A)-$(B)", variables) == "1-two"
    assert expand("$(MISSING)", variables) == "$(MISSING)"
    assert expand("$$(A)", variables) == "$(A)"
    assert expand("$(A", variables) == "$(A"
    assert expand("cost $5", variables) == "cost $5"
    assert expand("trailing $", variables) == "trailing $"


def test_grace_period_is_the_kubelets() -> None:
    assert effective_grace_seconds({"metadata": {"deletionGracePeriodSeconds": 7}}) == 7
    # A force delete (0) falls back to the spec, and the kubelet never gives less than 1 s.
    force = {"metadata": {"deletionGracePeriodSeconds": 0}, "spec": {}}
    assert effective_grace_seconds(force) == 30
    zero_spec = {"metadata": {}, "spec": {"terminationGracePeriodSeconds": 0}}
    assert effective_grace_seconds(zero_spec) == 1


def test_termination_message_limits_and_log_fallback(tmp_path: Path) -> None:
    message, log = tmp_path / "message", tmp_path / "log"
    message.write_bytes(b"x" * 5000)
    log.write_bytes(b"".join(b"line %d\n" % i for i in range(100)))
    assert len(read_termination_message(message, log, exit_code=1, fallback_to_logs=True)) == 4096
    message.write_bytes(b"")
    fallback = read_termination_message(message, log, exit_code=1, fallback_to_logs=True)
    assert fallback.startswith("line 20\n") and fallback.endswith("line 99\n")
    assert read_termination_message(message, log, exit_code=0, fallback_to_logs=True) == ""


# ---- on the real control plane --------------------------------------------------------


@pytest.fixture
def api(control_plane: Any) -> Iterator[Any]:
    client = control_plane.api_client()
    try:
        yield client
    finally:
        client.close()


@pytest.fixture
def core(api: Any) -> Any:
    from kubernetes import client

    return client.CoreV1Api(api)


@pytest.fixture
def namespace(core: Any) -> Iterator[str]:
    from kubernetes import client

    name = f"pod-runner-{uuid.uuid4().hex[:8]}"
    core.create_namespace(client.V1Namespace(metadata=client.V1ObjectMeta(name=name)))
    try:
        yield name
    finally:
        # Without a namespace controller it stays Terminating; the name is never reused.
        core.delete_namespace(name)


def _pod(
    name: str,
    script: str,
    *,
    restart_policy: str = "Never",
    env: list[dict[str, Any]] | None = None,
    grace: int | None = None,
    **container: Any,
) -> dict[str, Any]:
    spec: dict[str, Any] = {
        "restartPolicy": restart_policy,
        "containers": [
            {
                "name": "main",
                "image": "python:3.11-slim",
                "command": ["python", "-c", script],
                "env": env or [],
                **container,
            }
        ],
    }
    if grace is not None:
        spec["terminationGracePeriodSeconds"] = grace
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name}, "spec": spec}


def _create(core: Any, namespace: str, pod: dict[str, Any]) -> None:
    core.create_namespaced_pod(namespace, pod)


def _phase(*phases: str) -> Callable[[dict[str, Any] | None], bool]:
    return lambda pod: pod is not None and pod.get("status", {}).get("phase") in phases


def _gone(pod: dict[str, Any] | None) -> bool:
    return pod is None


def _main_status(pod: dict[str, Any] | None) -> dict[str, Any]:
    assert pod is not None
    statuses: dict[str, dict[str, Any]] = {s["name"]: s for s in pod["status"]["containerStatuses"]}
    return statuses["main"]


def _eventually(check: Callable[[], bool], what: str, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.05)


# A process that says it is ready once its SIGTERM handler is in place, so a test knows
# when a signal would reach the handler. MARKER records that the handler ran.
_HANDLES_SIGTERM = """
import os, pathlib, signal, sys
def on_term(signum, frame):
    pathlib.Path(os.environ["MARKER"]).write_text("SIGTERM handled")
    sys.exit(143)
signal.signal(signal.SIGTERM, on_term)
pathlib.Path(os.environ["READY"]).write_text("ready")
while True:
    signal.pause()
"""

_IGNORES_SIGTERM = """
import os, pathlib, signal
signal.signal(signal.SIGTERM, signal.SIG_IGN)
pathlib.Path(os.environ["READY"]).write_text("ready")
while True:
    signal.pause()
"""


def _files_env(tmp_path: Path) -> tuple[list[dict[str, Any]], Path, Path]:
    ready, marker = tmp_path / "ready", tmp_path / "marker"
    env = [{"name": "READY", "value": str(ready)}, {"name": "MARKER", "value": str(marker)}]
    return env, ready, marker


@pytest.mark.bench_infra
def test_pod_runs_to_success_with_its_termination_message(
    pod_runner: PodRunner, api: Any, core: Any, namespace: str
) -> None:
    script = (
        "import os\n"
        "print('hello from the pod', flush=True)\n"
        "open(os.environ['TERMINATION_MESSAGE_PATH'], 'w').write('all done')\n"
    )
    _create(core, namespace, _pod("hello", script))
    pod = wait_for_pod(api, namespace, "hello", _phase("Succeeded", "Failed"))
    assert pod is not None
    assert pod["status"]["phase"] == "Succeeded"
    assert pod["spec"]["nodeName"] == "bench-node"
    assert pod["status"]["podIP"] == "127.0.0.1"
    terminated = _main_status(pod)["state"]["terminated"]
    assert (terminated["exitCode"], terminated["reason"]) == (0, "Completed")
    assert terminated["message"] == "all done"
    assert terminated["containerID"].startswith("local://")
    conditions = {c["type"]: c["status"] for c in pod["status"]["conditions"]}
    assert conditions["PodScheduled"] == "True"
    assert conditions["Ready"] == "False"
    assert "hello from the pod" in pod_runner.logs(namespace, "hello")


@pytest.mark.bench_infra
def test_env_from_secret_configmap_and_fields_reaches_the_process(
    pod_runner: PodRunner, api: Any, core: Any, namespace: str
) -> None:
    core.create_namespaced_secret(
        namespace, {"metadata": {"name": "creds"}, "stringData": {"api-key": "s3cr3t"}}
    )
    core.create_namespaced_config_map(
        namespace, {"metadata": {"name": "settings"}, "data": {"MODE": "fast"}}
    )
    script = (
        "import json, os\n"
        "keys = ['API_KEY', 'CFG_MODE', 'POD_NAME', 'POD_IP', 'GREETING']\n"
        "data = json.dumps({k: os.environ.get(k) for k in keys})\n"
        "open(os.environ['TERMINATION_MESSAGE_PATH'], 'w').write(data)\n"
    )
    env: list[dict[str, Any]] = [
        {"name": "API_KEY", "valueFrom": {"secretKeyRef": {"name": "creds", "key": "api-key"}}},
        {"name": "POD_NAME", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}},
        {"name": "POD_IP", "valueFrom": {"fieldRef": {"fieldPath": "status.podIP"}}},
        {"name": "GREETING", "value": "hi $(POD_NAME)"},
    ]
    envfrom = [{"configMapRef": {"name": "settings"}, "prefix": "CFG_"}]
    _create(core, namespace, _pod("envs", script, env=env, envFrom=envfrom))
    pod = wait_for_pod(api, namespace, "envs", _phase("Succeeded", "Failed"))
    seen = json.loads(_main_status(pod)["state"]["terminated"]["message"])
    assert seen == {
        "API_KEY": "s3cr3t",
        "CFG_MODE": "fast",
        "POD_NAME": "envs",
        "POD_IP": "127.0.0.1",
        "GREETING": "hi envs",
    }


@pytest.mark.bench_infra
def test_a_missing_secret_volume_holds_the_container_until_it_exists(
    pod_runner: PodRunner, api: Any, core: Any, namespace: str
) -> None:
    script = (
        "import os\n"
        "message = open(os.environ['TERMINATION_MESSAGE_PATH'], 'w')\n"
        "message.write(open(os.environ['KEY_FILE']).read())\n"
    )
    pod = _pod("mounts-later", script, env=[{"name": "KEY_FILE", "value": "/v/k"}])
    pod["spec"]["volumes"] = [{"name": "v", "secret": {"secretName": "later-volume"}}]
    pod["spec"]["containers"][0]["volumeMounts"] = [{"name": "v", "mountPath": "/v"}]
    _create(core, namespace, pod)
    waiting = wait_for_pod(
        api,
        namespace,
        "mounts-later",
        lambda p: (
            p is not None
            and any(
                "MountVolume.SetUp failed" in s["state"].get("waiting", {}).get("message", "")
                for s in p["status"].get("containerStatuses") or []
            )
        ),
    )
    assert waiting is not None and waiting["status"]["phase"] == "Pending"
    [container] = waiting["status"]["containerStatuses"]
    assert container["state"]["waiting"]["reason"] == "ContainerCreating"
    assert 'secret "later-volume" not found' in container["state"]["waiting"]["message"]
    core.create_namespaced_secret(
        namespace, {"metadata": {"name": "later-volume"}, "stringData": {"k": "mounted"}}
    )
    done = wait_for_pod(api, namespace, "mounts-later", _phase("Succeeded", "Failed"))
    assert _main_status(done)["state"]["terminated"]["message"] == "mounted"


@pytest.mark.bench_infra
def test_missing_secret_holds_the_container_until_it_exists(
    pod_runner: PodRunner, api: Any, core: Any, namespace: str
) -> None:
    env = [{"name": "TOKEN", "valueFrom": {"secretKeyRef": {"name": "later", "key": "token"}}}]
    script = (
        "import os; open(os.environ['TERMINATION_MESSAGE_PATH'], 'w').write(os.environ['TOKEN'])"
    )
    _create(core, namespace, _pod("waits", script, env=env))
    pod = wait_for_pod(
        api,
        namespace,
        "waits",
        lambda p: (
            p is not None
            and any(
                s["state"].get("waiting", {}).get("reason") == "CreateContainerConfigError"
                for s in p["status"].get("containerStatuses") or []
            )
        ),
    )
    assert pod is not None
    assert pod["status"]["phase"] == "Pending"
    core.create_namespaced_secret(
        namespace, {"metadata": {"name": "later"}, "stringData": {"token": "t0k"}}
    )
    pod = wait_for_pod(api, namespace, "waits", _phase("Succeeded", "Failed"))
    assert _main_status(pod)["state"]["terminated"]["message"] == "t0k"


# Reads the mounted key once, says so, waits for it to change, and reports both values.
_FOLLOWS_A_SECRET_FILE = """
import os, pathlib, time
path = pathlib.Path(os.environ["TOKEN_FILE"])
first = path.read_text()
pathlib.Path(os.environ["READY"]).write_text(first)
while path.read_text() == first:
    time.sleep(0.05)
open(os.environ["TERMINATION_MESSAGE_PATH"], "w").write(first + " then " + path.read_text())
"""


@pytest.mark.bench_infra
def test_a_secret_volume_reaches_the_process_and_follows_the_secret(
    pod_runner: PodRunner, api: Any, core: Any, namespace: str, tmp_path: Path
) -> None:
    env, ready, _ = _files_env(tmp_path)
    env.append({"name": "TOKEN_FILE", "value": "/var/run/secrets/app/token"})
    pod = _pod(
        "mounts",
        _FOLLOWS_A_SECRET_FILE,
        env=env,
        volumeMounts=[{"name": "creds", "mountPath": "/var/run/secrets/app", "readOnly": True}],
    )
    pod["spec"]["volumes"] = [{"name": "creds", "secret": {"secretName": "app-creds"}}]
    _create(core, namespace, pod)
    waiting = wait_for_pod(
        api,
        namespace,
        "mounts",
        lambda p: (
            p is not None
            and any(
                s["state"].get("waiting", {}).get("reason") == "ContainerCreating"
                and "app-creds" in s["state"]["waiting"].get("message", "")
                for s in p["status"].get("containerStatuses") or []
            )
        ),
    )
    assert waiting is not None and waiting["status"]["phase"] == "Pending"
    core.create_namespaced_secret(
        namespace, {"metadata": {"name": "app-creds"}, "stringData": {"token": "first"}}
    )
    _eventually(ready.exists, "the process to read the mounted file")
    assert ready.read_text() == "first"
    core.patch_namespaced_secret("app-creds", namespace, {"stringData": {"token": "second"}})
    done = wait_for_pod(api, namespace, "mounts", _phase("Succeeded", "Failed"))
    assert _main_status(done)["state"]["terminated"]["message"] == "first then second"


@pytest.mark.bench_infra
def test_init_containers_run_first_then_containers_together(
    pod_runner: PodRunner, api: Any, core: Any, namespace: str, tmp_path: Path
) -> None:
    shared = tmp_path / "shared"
    env = [{"name": "SHARED", "value": str(shared)}]
    init = (
        "import os, pathlib\n"
        "pathlib.Path(os.environ['SHARED']).mkdir()\n"
        "pathlib.Path(os.environ['SHARED'], 'init').write_text('done')\n"
    )
    # Each waits for the other's file, so they can only finish if they run at once.
    pair = (
        "import os, pathlib, sys, time\n"
        "me, other = sys.argv[1], sys.argv[2]\n"
        "d = pathlib.Path(os.environ['SHARED'])\n"
        "assert (d / 'init').read_text() == 'done'\n"
        "(d / me).write_text('here')\n"
        "while not (d / other).exists():\n"
        "    time.sleep(0.01)\n"
    )

    def container(name: str, script: str, *args: str) -> dict[str, Any]:
        return {
            "name": name,
            "image": "python:3.11-slim",
            "command": ["python", "-c", script, *args],
            "env": env,
        }

    pod = {
        "metadata": {"name": "phases"},
        "spec": {
            "restartPolicy": "Never",
            "initContainers": [container("setup", init)],
            "containers": [
                container("left", pair, "left", "right"),
                container("right", pair, "right", "left"),
            ],
        },
    }
    _create(core, namespace, pod)
    done = wait_for_pod(api, namespace, "phases", _phase("Succeeded", "Failed"))
    assert done is not None
    assert done["status"]["phase"] == "Succeeded"
    (setup,) = done["status"]["initContainerStatuses"]
    assert setup["state"]["terminated"]["exitCode"] == 0
    codes = {
        s["name"]: s["state"]["terminated"]["exitCode"] for s in done["status"]["containerStatuses"]
    }
    assert codes == {"left": 0, "right": 0}


@pytest.mark.bench_infra
def test_failed_container_is_restarted_under_on_failure(
    pod_runner: PodRunner, api: Any, core: Any, namespace: str, tmp_path: Path
) -> None:
    script = (
        "import os, pathlib, sys\n"
        "count = pathlib.Path(os.environ['COUNT'])\n"
        "n = int(count.read_text()) + 1 if count.exists() else 1\n"
        "count.write_text(str(n))\n"
        "print(f'attempt {n}', flush=True)\n"
        "sys.exit(3 if n == 1 else 0)\n"
    )
    env = [{"name": "COUNT", "value": str(tmp_path / "count")}]
    _create(core, namespace, _pod("flaky", script, restart_policy="OnFailure", env=env))
    pod = wait_for_pod(api, namespace, "flaky", _phase("Succeeded", "Failed"))
    assert pod is not None
    assert pod["status"]["phase"] == "Succeeded"
    main = _main_status(pod)
    assert main["restartCount"] == 1
    assert main["lastState"]["terminated"]["exitCode"] == 3
    assert "attempt 2" in pod_runner.logs(namespace, "flaky")
    assert "attempt 1" in pod_runner.logs(namespace, "flaky", previous=True)


@pytest.mark.bench_infra
def test_delete_sends_sigterm_to_the_handler_and_then_removes_the_pod(
    pod_runner: PodRunner, api: Any, core: Any, namespace: str, tmp_path: Path
) -> None:
    env, ready, marker = _files_env(tmp_path)
    _create(core, namespace, _pod("graceful", _HANDLES_SIGTERM, env=env, grace=30))
    wait_for_pod(api, namespace, "graceful", _phase("Running"))
    _eventually(ready.exists, "the SIGTERM handler to be installed")
    core.delete_namespaced_pod("graceful", namespace)
    # 143 is the handler's own exit: it ran before any SIGKILL (which would be 137).
    assert pod_runner.wait_exited(namespace, "graceful") == {"main": 143}
    assert marker.read_text() == "SIGTERM handled"
    wait_for_pod(api, namespace, "graceful", _gone)


@pytest.mark.bench_infra
def test_force_delete_still_gives_the_process_its_sigterm(
    pod_runner: PodRunner, api: Any, core: Any, namespace: str, tmp_path: Path
) -> None:
    env, ready, marker = _files_env(tmp_path)
    _create(core, namespace, _pod("forced", _HANDLES_SIGTERM, env=env, grace=30))
    wait_for_pod(api, namespace, "forced", _phase("Running"))
    _eventually(ready.exists, "the SIGTERM handler to be installed")
    core.delete_namespaced_pod("forced", namespace, grace_period_seconds=0)
    wait_for_pod(api, namespace, "forced", _gone)  # the API forgets it at once...
    # ...but, as with a real kubelet, the process is still stopped gracefully.
    assert pod_runner.wait_exited(namespace, "forced") == {"main": 143}
    assert marker.read_text() == "SIGTERM handled"


@pytest.mark.bench_infra
def test_process_ignoring_sigterm_is_killed_after_the_grace_period(
    pod_runner: PodRunner, api: Any, core: Any, namespace: str, tmp_path: Path
) -> None:
    env, ready, _ = _files_env(tmp_path)
    _create(core, namespace, _pod("stubborn", _IGNORES_SIGTERM, env=env, grace=1))
    wait_for_pod(api, namespace, "stubborn", _phase("Running"))
    _eventually(ready.exists, "SIGTERM to be ignored")
    core.delete_namespaced_pod("stubborn", namespace)
    assert pod_runner.wait_exited(namespace, "stubborn") == {"main": 128 + signal.SIGKILL}
    wait_for_pod(api, namespace, "stubborn", _gone)


@pytest.mark.bench_infra
def test_hard_eviction_kills_without_grace_and_leaves_a_failed_pod(
    pod_runner: PodRunner, api: Any, core: Any, namespace: str, tmp_path: Path
) -> None:
    env, ready, marker = _files_env(tmp_path)
    _create(core, namespace, _pod("evictee", _HANDLES_SIGTERM, env=env, grace=30))
    wait_for_pod(api, namespace, "evictee", _phase("Running"))
    _eventually(ready.exists, "the SIGTERM handler to be installed")
    pod_runner.evict(namespace, "evictee")
    pod = wait_for_pod(api, namespace, "evictee", _phase("Failed"))
    assert pod is not None
    assert pod["status"]["reason"] == "Evicted"
    assert pod["status"]["message"].startswith("The node was low on resource: memory.")
    assert "DisruptionTarget" in {c["type"] for c in pod["status"]["conditions"]}
    assert _main_status(pod)["state"]["terminated"]["exitCode"] == 137
    assert not marker.exists()  # no SIGTERM ever reached the handler


@pytest.mark.bench_infra
def test_oom_kill_reports_oomkilled_137(
    pod_runner: PodRunner, api: Any, core: Any, namespace: str, tmp_path: Path
) -> None:
    env, _, _ = _files_env(tmp_path)
    _create(core, namespace, _pod("hungry", _HANDLES_SIGTERM, env=env))
    wait_for_pod(api, namespace, "hungry", _phase("Running"))
    pod_runner.oom_kill(namespace, "hungry")
    pod = wait_for_pod(api, namespace, "hungry", _phase("Failed", "Succeeded"))
    assert pod is not None
    assert pod["status"]["phase"] == "Failed"
    terminated = _main_status(pod)["state"]["terminated"]
    assert (terminated["exitCode"], terminated["reason"]) == (137, "OOMKilled")


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


@pytest.mark.bench_infra
def test_lost_node_leaves_pods_running_until_declared_gone_then_a_new_node_takes_over(
    pod_runner: PodRunner, api: Any, core: Any, namespace: str, tmp_path: Path
) -> None:
    from kubernetes.client.exceptions import ApiException

    script = "import signal\nwhile True:\n    signal.pause()\n"
    for name in ("first", "second"):
        _create(core, namespace, _pod(name, script))
    pids = []
    for name in ("first", "second"):
        pod = wait_for_pod(api, namespace, name, _phase("Running"))
        pids.append(int(_main_status(pod)["containerID"].removeprefix("local://")))
    assert all(_alive(pid) for pid in pids)

    pod_runner.lose_node()
    assert not any(_alive(pid) for pid in pids)
    for name in ("first", "second"):
        pod = core.read_namespaced_pod(name, namespace)
        assert pod.status.phase == "Running"  # nobody is left to say otherwise

    pod_runner.declare_node_gone()
    for name in ("first", "second"):
        wait_for_pod(api, namespace, name, _gone)
    with pytest.raises(ApiException) as missing_node:
        core.read_node("bench-node")
    assert missing_node.value.status == 404

    replacement = PodRunner(api, node_name="bench-node-2")
    replacement.start()
    try:
        _create(core, namespace, _pod("first", "print('resumed')"))
        pod = wait_for_pod(api, namespace, "first", _phase("Succeeded", "Failed"))
        assert pod is not None
        assert (pod["spec"]["nodeName"], pod["status"]["phase"]) == ("bench-node-2", "Succeeded")
    finally:
        replacement.stop()
