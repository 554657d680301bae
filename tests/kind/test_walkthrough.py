"""docs/walkthrough.md, run as written on a kind cluster on our machines.

Every command comes out of the walkthrough's own ``sh`` blocks (so a change there changes
what runs here), with what this machine needs on top, each said where it happens:

- ``kind create cluster`` gets ``--image`` (the node image assembled here) and the test
  config (``kind-config.yaml`` plus the patches for our machines' quirks);
- ``docker build -t alpineagents:dev .`` is the bench's build of the same Dockerfile on a
  Debian python base (tests/bench/images.py), tagged ``alpineagents:dev``;
- ``helm install`` gets ``--set echoModel.enabled=true``, the walkthrough's "no API key, or
  no network?" option, and MinIO's image (pulled from quay.io by users) is the bench's
  MinIO build, put on the node with ``kind load`` under the chart's image name.

The watch (``kubectl get ar -w``) is replaced by ``kubectl wait`` for the phases it shows;
the viewer's ``kubectl port-forward`` runs in the background (the walkthrough's "until
Ctrl+C") while its ``curl`` reads the runs list.
The cluster ``kind create cluster --config kind-config.yaml`` makes must have one Ready
node, and ``kind delete cluster`` must remove it.
"""

from __future__ import annotations

import contextlib
import json
import re
import subprocess
import threading
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml

from alpineagents.state import UNKNOWN_RESULT
from tests.bench.images import ensure_images
from tests.bench.kind_cluster import config_for_our_machines, environment, kind, node_logs
from tests.bench.testbin import binary_path
from tests.kind.conftest import KindBench
from tests.paths import REPO

pytestmark = pytest.mark.kind

WALKTHROUGH = REPO / "docs" / "walkthrough.md"
CLUSTER = "alpineagents"


def walkthrough_commands() -> list[str]:
    """Every command of the walkthrough's ``sh`` blocks, continuation lines joined."""
    commands = []
    for block in re.findall(r"```sh\n(.*?)```", WALKTHROUGH.read_text(), re.S):
        for command in block.replace("\\\n", " ").splitlines():
            command = re.sub(r"\s+#.*$", "", command).strip()
            if command:
                commands.append(re.sub(r"\s+", " ", command))
    return commands


def command(starting: str) -> str:
    """The walkthrough's one command that starts with ``starting``."""
    found = [line for line in walkthrough_commands() if line.startswith(starting)]
    assert len(found) == 1, f"the walkthrough has {len(found)} commands starting {starting!r}"
    return found[0]


def minio_answers(url: str, attempts: int = 60) -> bool:
    """Whether ``url`` answers 200 within ``attempts`` tries a second apart."""
    for _ in range(attempts):
        try:
            with urllib.request.urlopen(url, timeout=5) as response:
                if response.status == 200:
                    return True
        except OSError:
            pass
        time.sleep(1)
    return False


def logs_show(env: dict[str, str], pod: str, text: str, timeout: float = 600) -> bool:
    """Follow ``pod``'s log until a line holds ``text`` (False: the pod ended or time ran
    out first)."""
    follow = ["kubectl", "-n", "agents", "logs", "--follow", f"pod/{pod}"]
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:  # logs fail until the container has started
        with subprocess.Popen(follow, env=env, stdout=subprocess.PIPE, text=True) as process:
            timer = threading.Timer(max(0.0, deadline - time.monotonic()), process.kill)
            timer.start()
            try:
                assert process.stdout is not None
                if any(text in line for line in process.stdout):
                    return True
            finally:
                timer.cancel()
                process.kill()
            if process.wait() == 0:
                return False  # the whole log was read
        time.sleep(1)
    return False


class Shell:
    """A user's shell in the repository, with docker, kind, kubectl and helm at hand."""

    def __init__(self, env: dict[str, str], home: Path) -> None:
        self.env = {
            **env,
            "HOME": str(home),
            "PATH": f"{binary_path('helm').parent}:{env['PATH']}",
        }

    def __call__(self, line: str, timeout: float = 600) -> str:
        result = subprocess.run(
            ["bash", "-euo", "pipefail", "-c", line],
            cwd=REPO,
            env=self.env,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            timeout=timeout,
            check=False,
        )
        assert result.returncode == 0, f"`{line}` failed ({result.returncode}):\n{result.stdout}"
        return result.stdout

    @contextlib.contextmanager
    def background(self, line: str) -> Iterator[Background]:
        """``line`` running meanwhile (as in a second terminal); stopped at the end."""
        process = subprocess.Popen(
            ["bash", "-euo", "pipefail", "-c", f"exec {line}"],
            cwd=REPO,
            env=self.env,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        try:
            yield Background(process)
        finally:
            process.terminate()
            try:
                process.wait(30)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()


class Background:
    """A command of the walkthrough that keeps running (``kubectl port-forward``)."""

    def __init__(self, process: subprocess.Popen[str]) -> None:
        self.process = process
        self.lines: list[str] = []

    def prints(self, text: str, timeout: float = 120) -> bool:
        """Read its output until a line holds ``text`` (False: it ended, or time ran out)."""
        assert self.process.stdout is not None
        timer = threading.Timer(timeout, self.process.kill)
        timer.start()
        try:
            for line in self.process.stdout:
                self.lines.append(line)
                if text in line:
                    return True
            return False
        finally:
            timer.cancel()

    def output(self) -> str:
        return "".join(self.lines)


def test_walkthrough_run_survives_its_pods_deletion_and_shows_in_the_viewer(
    kind_bench: KindBench, tmp_path: Path
) -> None:
    docker = kind_bench.docker
    kubeconfig = tmp_path / "kubeconfig"
    config = config_for_our_machines(REPO / "kind-config.yaml", tmp_path / "kind-config.yaml")
    create = command("kind create cluster")
    assert create == "kind create cluster --config kind-config.yaml"
    sh = Shell(environment(docker, kubeconfig), tmp_path)
    try:
        # 1. A cluster.
        sh(
            create.replace("kind-config.yaml", str(config))
            + f" --image {kind_bench.node_image} --wait 300s",
            timeout=900,
        )
        nodes = json.loads(sh("kubectl get nodes -o json"))["items"]
        ready = {
            node["metadata"]["name"]: next(
                c["status"] for c in node["status"]["conditions"] if c["type"] == "Ready"
            )
            for node in nodes
        }
        assert ready == {f"{CLUSTER}-control-plane": "True"}
        # 2. The image.
        images = ensure_images()
        ours, minio = images["alpineagents"], images["minio"]
        for image in (ours, minio):
            if not docker.has(image.ref):
                docker.run("load", "--input", str(image.archive))
        assert command("docker build") == "docker build -t alpineagents:dev ."
        docker.run("tag", ours.ref, "alpineagents:dev")
        sh(command("kind load docker-image alpineagents:dev"), timeout=900)
        values = yaml.safe_load((REPO / "charts/alpineagents/values.yaml").read_text())
        minio_image = f"{values['minio']['image']['repository']}:{values['minio']['image']['tag']}"
        docker.run("tag", minio.ref, minio_image)
        sh(f"kind load docker-image {minio_image} --name {CLUSTER}", timeout=900)
        # 3. The chart, with the echo model instead of an API key.
        sh(command("helm install alpineagents") + " --set echoModel.enabled=true", timeout=600)
        for rollout in (
            "deployment/alpineagents-operator",
            "statefulset/",
            "deployment/alpineagents-viewer",
        ):
            sh(command(f"kubectl -n agents rollout status {rollout}") + " --timeout=600s")
        # 4. A run.
        sh(command("kubectl -n agents apply -f examples/agentrun.yaml"))
        wait = "kubectl -n agents wait ar/disk-report --timeout=600s --for=jsonpath="
        sh(wait + "'{.status.phase}'=Running")
        sh(wait + "'{.status.attempt}'=1")
        # 5. Delete its pod in the middle of a step (the shell command sleeps 20 s).
        # The pod's progress log says when the model's reply that calls the command is in.
        assert logs_show(sh.env, "disk-report-1", "calls shell"), "the run never called shell"
        sh(command("kubectl -n agents delete pod disk-report-1"))
        sh(wait + "'{.status.attempt}'=2")
        sh(wait + "'{.status.phase}'=Succeeded", timeout=900)
        described = sh(command("kubectl -n agents describe ar disk-report"))
        assert "Succeeded" in described
        logs = sh(command("kubectl -n agents logs disk-report-2"))
        assert logs.strip(), "the resumed pod logged nothing"
        # 6. The answer, from the resumed pod: the echo model repeats the interrupted
        # command's result, which is aborted. The deleted pod saves it so as it stops,
        # "(aborted: SystemExit)", unless the operator's claim for the new pod fenced that
        # save off first; then the new pod's load closes the call as a killed pod's.
        aborted = sh("kubectl -n agents get ar disk-report -o jsonpath='{.status.abortedCalls}'")
        assert len(json.loads(aborted)) == 1, aborted
        answer = sh(command("kubectl -n agents get ar disk-report -o jsonpath='{.status.answer}'"))
        assert "(aborted: SystemExit)" in answer or UNKNOWN_RESULT in answer, answer
        password = sh(command("kubectl -n agents get secret alpineagents-minio"))
        assert password.strip(), "MinIO's generated root password is empty"
        # kind-config.yaml's port mapping: MinIO's S3 API on the machine's loopback.
        assert minio_answers("http://127.0.0.1:9000/minio/health/live")
        # 7. The run viewer, through kubectl port-forward (running until it is stopped),
        # lists the run with its AgentRun, both attempts and the answer.
        with sh.background(command("kubectl -n agents port-forward service/")) as forward:
            assert forward.prints("Forwarding from 127.0.0.1:8765"), forward.output()
            listed = json.loads(sh(command("curl -s http://127.0.0.1:8765/api/runs")))
        [run] = [r for r in listed["runs"] if (r["cluster"] or {}).get("name") == "disk-report"]
        assert run["saved"] and run["stopped"] == "answered", run
        assert run["cluster"]["phase"] == "Succeeded" and run["cluster"]["attempt"] == 2, run
        assert listed["cluster_error"] is None, listed["cluster_error"]
    except AssertionError as failure:
        raise AssertionError(
            f"{failure}\n--- node journal ---\n{node_logs(docker, CLUSTER)}"
        ) from failure
    finally:
        sh(command("kind delete cluster"), timeout=600)
    assert CLUSTER not in kind(docker, "get", "clusters", kubeconfig=kubeconfig).split()
