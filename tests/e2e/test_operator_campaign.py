"""The operator side of the fault campaign (issue 13), on the bench's real node.

Seeded and reproducible in what it does (which run, which fault, after how long); which
step of a run a fault hits depends on the machine's speed. Each part checks what must
hold and writes its totals to ``docs/reliability.md`` (below the operator marker):

- pod losses: ``RUNS`` AgentRuns at once (a run that ends is replaced by a new one)
  until ``POD_LOSSES`` pods were lost, each at a random moment of its pod's life, by a
  graceful delete, a force delete, an API eviction or a SIGKILL of its container;
- operator kills: the operator's pod force-deleted ``OPERATOR_KILLS`` times while
  ``OPERATOR_RUNS`` runs are active (some of them finishing while it is down);
- store outage: the store (the chart's MinIO) frozen for ``OUTAGE_SECONDS`` while
  ``OUTAGE_RUNS`` runs finish their tool calls;
- a silent node with a zombie writer: the kubelet of the node a run's pod is on stops
  (its containers keep running, no PodGC), the operator replaces the pod on the other
  node within a bounded time, and the old pod, still running, can save nothing more.

Every run's tool calls go through the bench's :class:`~tests.bench.tool_gate.ToolGate`,
which counts every start of a call in any pod. What must hold for every run: it ends
Succeeded; no call starts twice; every call has exactly one result and the saved seqs
have no gaps; ``status.abortedCalls`` is what the history says; ``status.restarts``
counts no more losses than the campaign caused; and a run never has two live pods.

Scale and seed from the environment: ``ALPINEAGENTS_CAMPAIGN_SEED`` (13),
``..._RUNS`` (6), ``..._POD_LOSSES`` (16), ``..._OPERATOR_RUNS`` (4),
``..._OPERATOR_KILLS`` (3), ``..._OUTAGE_RUNS`` (2), ``..._OUTAGE_SECONDS`` (60). The
defaults fit the suite's time budget on a 2-core machine; the full campaign of issue 13
(30 runs, 100 losses, 20 runs under 10 operator kills, 5 under a 60 s outage) is
``ALPINEAGENTS_CAMPAIGN_SCALE=full`` (about 40 min here), and docs/reliability.md says
which one it was.
"""

from __future__ import annotations

import json
import os
import platform
import random
import time
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import pytest

from tests.bench.tool_gate import ToolGate
from tests.campaign.report import write_operator_part
from tests.e2e.environment import JSON, Environment, apply_run, in_phase, status, wait_for_run

pytestmark = pytest.mark.e2e

OPERATOR_PODS = "app.kubernetes.io/component=operator"
CALLS_PER_RUN = 2
FINISH_SECONDS = 900.0  # for every run of a part to end once its faults are over
LOSS_KINDS = ("delete", "force-delete", "evict", "sigkill")
# Runs that wait in their tool calls: small requests, so 30 fit the bench's 2-CPU node.
SMALL = {"requests": {"cpu": "10m", "memory": "64Mi"}, "limits": {"memory": "512Mi"}}
QUICK_FAILOVER = [
    {
        "key": f"node.kubernetes.io/{taint}",
        "operator": "Exists",
        "effect": "NoExecute",
        "tolerationSeconds": 5,
    }
    for taint in ("unreachable", "not-ready")
]


def setting(name: str, default: int) -> int:
    return int(os.environ.get(f"ALPINEAGENTS_CAMPAIGN_{name}", str(default)))


FULL = os.environ.get("ALPINEAGENTS_CAMPAIGN_SCALE") == "full"
SEED = setting("SEED", 13)
RUNS = setting("RUNS", 30 if FULL else 6)
POD_LOSSES = setting("POD_LOSSES", 100 if FULL else 16)
OPERATOR_RUNS = setting("OPERATOR_RUNS", 20 if FULL else 4)
OPERATOR_KILLS = setting("OPERATOR_KILLS", 10 if FULL else 3)
OUTAGE_RUNS = setting("OUTAGE_RUNS", 5 if FULL else 2)
OUTAGE_SECONDS = setting("OUTAGE_SECONDS", 60)


# ------------------------------------------------------------------------------ the runs
@dataclass
class Campaign:
    """The environment, the seeded choices, and what the parts found."""

    env: Environment
    gate: ToolGate
    rng: random.Random
    sections: dict[str, str] = field(default_factory=dict)
    inflicted: Counter[str] = field(default_factory=Counter)
    """Pod losses the campaign caused, per run."""
    most_live_pods: int = 0
    """The most live pods one run had at any moment the campaign looked."""
    two_live: list[str] = field(default_factory=list)
    """What the campaign saw when a run had more than one live pod."""
    samples: int = 0

    def calls(self, run: str) -> list[str]:
        return [f"{run}-c{i + 1}" for i in range(CALLS_PER_RUN)]

    def start(self, run: str, **spec: object) -> None:
        """An AgentRun whose model calls ``CALLS_PER_RUN`` gated shell commands at once."""
        lines = ["Do the job."] + [
            "use shell " + json.dumps({"command": self.gate.command(call), "timeout": 1800})
            for call in self.calls(run)
        ]
        policy = {"maxRestarts": 200, "initialBackoffSeconds": 0, "maxBackoffSeconds": 2}
        apply_run(self.env, run, "\n".join(lines), restartPolicy=policy, resources=SMALL, **spec)

    def wait_started(self, run: str) -> None:
        """Wait until every call of ``run`` started; if one does not, say where the run is."""
        for call in self.calls(run):
            try:
                self.gate.wait_started(call, timeout=600)
            except AssertionError as error:
                body = self.runs().get(run)
                pods = [
                    (p["metadata"]["name"], p.get("status", {}).get("phase"))
                    for p in self.look().get(run, [])
                ]
                log = self.env.kubectl(
                    "logs", f"deployment/{self.env.operator}", "--tail=40", check=False
                )
                error.add_note(f"run: {status(body)}; pods: {pods}\noperator:\n{log.stdout}")
                raise

    def release(self, run: str) -> None:
        for call in self.calls(run):
            self.gate.release(call)

    def runs(self) -> dict[str, JSON]:
        listing = self.env.kubectl("get", "agentruns", "-o", "json")
        return {r["metadata"]["name"]: r for r in json.loads(listing.stdout)["items"]}

    def pods(self) -> list[JSON]:
        listing = self.env.kubectl("get", "pods", "-l", "alpineagents.dev/run", "-o", "json")
        return list(json.loads(listing.stdout)["items"])

    def look(self) -> dict[str, list[JSON]]:
        """The runs' pods by run; counts how many live pods each run has now."""
        by_run: dict[str, list[JSON]] = {}
        for pod in self.pods():
            by_run.setdefault(pod["metadata"]["labels"]["alpineagents.dev/run"], []).append(pod)
        for run, pods in by_run.items():
            live = [p for p in pods if _live(p)]
            self.most_live_pods = max(self.most_live_pods, len(live))
            if len(live) > 1:
                self.two_live.append(f"{run}: {[_pod_state(p) for p in live]}")
        self.samples += 1
        return by_run

    def lose(self, pod: JSON, kind: str) -> None:
        """Lose ``pod`` the way ``kind`` says."""
        name = pod["metadata"]["name"]
        if kind == "delete":
            self.env.kubectl("delete", "pod", name, "--wait=false", check=False)
        elif kind == "force-delete":
            self.env.kubectl(
                "delete", "pod", name, "--grace-period=0", "--force", "--wait=false", check=False
            )
        elif kind == "evict":
            eviction = {
                "apiVersion": "policy/v1",
                "kind": "Eviction",
                "metadata": {"name": name, "namespace": self.env.namespace},
            }
            path = f"/api/v1/namespaces/{self.env.namespace}/pods/{name}/eviction"
            self.env.kubectl(
                "create", "--raw", path, "-f", "-", input=json.dumps(eviction), check=False
            )
        else:
            self.node_of(pod).ctr("tasks", "kill", "-s", "SIGKILL", _container(pod), check=False)

    def node_of(self, pod: JSON) -> Any:
        """The bench node (:class:`~tests.bench.kubelet_node.KubeletNode`) ``pod`` is on."""
        return self.env.real_node.nodes[pod["spec"]["nodeName"]]

    def wait_ended(self, runs: list[str]) -> dict[str, JSON]:
        """The runs' bodies once every one has ended (Succeeded or Failed)."""
        deadline = time.monotonic() + FINISH_SECONDS
        ended: dict[str, JSON] = {}
        for run in runs:
            left = max(1.0, deadline - time.monotonic())
            body = wait_for_run(
                self.env,
                run,
                lambda r: status(r).get("phase") in ("Succeeded", "Failed"),
                "ended",
                left,
            )
            assert body is not None
            ended[run] = body
        return ended

    def check(self, ended: dict[str, JSON], counts: Counter[str]) -> None:
        """What must hold for every run that ended (see the module docstring)."""
        for run, body in ended.items():
            done = status(body)
            assert done["phase"] == "Succeeded", (run, done)
            starts = [self.gate.starts(call) for call in self.calls(run)]
            assert max(starts) <= 1, (run, starts)
            counts["runs Succeeded"] += 1
            counts["calls started once or never"] += len(starts)
            history = self.env.history(done["stateId"]) or []
            seqs = sorted(int(e["seq"]) for e in history)
            assert seqs == list(range(len(seqs))), (run, seqs)
            counts["histories without gaps"] += 1
            asked = [
                block["id"]
                for e in history
                if e["kind"] == "model_reply"
                for block in e["data"]["message"].get("content") or []
                if block.get("type") == "tool_use"
            ]
            results = [e["data"] for e in history if e["kind"] == "tool_result"]
            assert sorted(asked) == sorted(r["call_id"] for r in results), (run, asked, results)
            counts["calls with exactly one result"] += len(asked)
            aborted = [r["call_id"] for r in results if r["outcome"] == "aborted"]
            assert sorted(done.get("abortedCalls") or []) == sorted(aborted), (run, done)
            counts["abortedCalls as in the history"] += 1
            counts["calls aborted"] += len(aborted)
            restarts = int(done.get("restarts") or 0)
            assert restarts <= self.inflicted[run], (run, restarts, self.inflicted[run])
            counts["restarts"] += restarts
        assert self.most_live_pods <= 1, self.two_live


def _live(pod: JSON) -> bool:
    """A pod that runs or will run, and is not on its way out: one whose agent could still
    write. The kubelet reports a container's end before it moves the pod's phase on, so a
    pod whose agent container has terminated is not live, whatever its phase says yet."""
    phase = (pod.get("status") or {}).get("phase")
    statuses = (pod.get("status") or {}).get("containerStatuses") or []
    ended = any(
        "terminated" in (s.get("state") or {}) for s in statuses if s.get("name") == "agent"
    )
    return (
        phase in ("Pending", "Running")
        and not pod["metadata"].get("deletionTimestamp")
        and not ended
    )


def _pod_state(pod: JSON) -> JSON:
    status = pod.get("status") or {}
    return {
        "name": pod["metadata"]["name"],
        "phase": status.get("phase"),
        "containers": [s.get("state") for s in status.get("containerStatuses") or []],
    }


def _container(pod: JSON, name: str = "agent") -> str:
    statuses = (pod.get("status") or {}).get("containerStatuses") or []
    found = next((s for s in statuses if s.get("name") == name), {})
    return str(found.get("containerID") or "").removeprefix("containerd://")


def _running(pod: JSON) -> bool:
    statuses = (pod.get("status") or {}).get("containerStatuses") or []
    return _live(pod) and any("running" in (s.get("state") or {}) for s in statuses)


def _table(counts: Counter[str]) -> str:
    rows = [f"| {what} | {n} |" for what, n in counts.items()]
    return "\n".join(["| checked | times |", "|---|---|", *rows])


# ------------------------------------------------------------------------------ fixtures
@pytest.fixture(scope="module")
def campaign(node_env: Environment, gate: ToolGate) -> Iterator[Campaign]:
    e2e = node_env
    found = Campaign(e2e, gate, random.Random(SEED))
    # A first run makes the store's bucket exist before the counted runs start.
    found.start("warm-up")
    found.release("warm-up")
    wait_for_run(e2e, "warm-up", in_phase("Succeeded"), "Succeeded", 300)
    yield found
    if found.sections:
        command = " ".join(
            [
                f"ALPINEAGENTS_CAMPAIGN_SEED={SEED} ALPINEAGENTS_CAMPAIGN_RUNS={RUNS}",
                f"ALPINEAGENTS_CAMPAIGN_POD_LOSSES={POD_LOSSES}",
                f"ALPINEAGENTS_CAMPAIGN_OPERATOR_RUNS={OPERATOR_RUNS}",
                f"ALPINEAGENTS_CAMPAIGN_OPERATOR_KILLS={OPERATOR_KILLS}",
                f"ALPINEAGENTS_CAMPAIGN_OUTAGE_RUNS={OUTAGE_RUNS}",
                f"ALPINEAGENTS_CAMPAIGN_OUTAGE_SECONDS={OUTAGE_SECONDS}",
                "python -m pytest tests/e2e/test_operator_campaign.py",
            ]
        )
        header = "\n".join(
            [
                "Written by `tests/e2e/test_operator_campaign.py` on the bench's real node",
                "(kubelet v1.35, containerd, the chart installed with helm, MinIO in the",
                "cluster). Do not edit by hand: each run rewrites the sections it ran.",
                "",
                f"- Seed: **{SEED}**. Run again: `{command}`",
                f"- Machine: {platform.system()} {platform.machine()}, "
                f"Python {platform.python_version()}",
                "- For every run: it ends Succeeded, no tool call starts twice, every call",
                "  has exactly one result, the saved seqs have no gaps, status.abortedCalls",
                "  is what the history says, status.restarts counts no loss the campaign did",
                "  not cause, and no run ever has two live pods.",
            ]
        )
        write_operator_part(header, found.sections)


# ------------------------------------------------------------------------------ the parts
def test_pod_losses_of_every_kind_at_random_moments(campaign: Campaign) -> None:
    rng, started, active = campaign.rng, 0, set[str]()
    kinds: Counter[str] = Counter()
    born: dict[str, float] = {}  # when the campaign first saw each pod
    began = time.monotonic()

    def replenish() -> None:
        nonlocal started
        while len(active) < RUNS:
            run = f"loss-{SEED}-{started:03d}"
            started += 1
            campaign.start(run)
            active.add(run)

    replenish()
    while sum(kinds.values()) < POD_LOSSES:
        pods = campaign.look()
        bodies = campaign.runs()
        for run in sorted(active):
            if status(bodies.get(run)).get("phase") in ("Succeeded", "Failed"):
                active.discard(run)
        replenish()
        now = time.monotonic()
        targets = []
        for run in sorted(active):
            current = status(bodies.get(run)).get("pod")
            for pod in pods.get(run, []):
                uid = pod["metadata"]["uid"]
                born.setdefault(uid, now)
                if pod["metadata"]["name"] == current and _running(pod):
                    targets.append((run, pod, now - born[uid]))
        if rng.random() < 0.15 and active:
            campaign.release(rng.choice(sorted(active)))  # some runs end without a loss
        # A random moment of a pod's life: anywhere in its first seconds, or later.
        ripe = [(r, p) for r, p, age in targets if age >= rng.uniform(0.0, 6.0)]
        if not ripe:
            time.sleep(0.5)  # pacing: the next look at the cluster
            continue
        run, pod = rng.choice(ripe)
        kind = rng.choice(LOSS_KINDS)
        campaign.lose(pod, kind)
        campaign.inflicted[run] += 1
        kinds[kind] += 1
    for run in sorted(active):
        campaign.release(run)
    created = [f"loss-{SEED}-{i:03d}" for i in range(started)]
    ended = campaign.wait_ended(created)
    counts: Counter[str] = Counter()
    campaign.check(ended, counts)
    minutes = (time.monotonic() - began) / 60
    lines = [
        f"{RUNS} AgentRuns at once ({started} in all: a run that ended was replaced), "
        f"{sum(kinds.values())} pods lost at random moments of their lives "
        f"({', '.join(f'{n} {k}' for k, n in sorted(kinds.items()))}), in {minutes:.0f} min. "
        f"The cluster was looked at {campaign.samples} times; the most live pods one run "
        f"had at once: {campaign.most_live_pods}.",
        "",
        _table(counts),
    ]
    campaign.sections["Real node: pod losses"] = "\n".join(lines)


def test_the_operator_killed_again_and_again_while_runs_go_on(campaign: Campaign) -> None:
    rng, env = campaign.rng, campaign.env
    runs = [f"opkill-{SEED}-{i:03d}" for i in range(OPERATOR_RUNS)]
    for run in runs:
        campaign.start(run)
    for run in runs:
        campaign.wait_started(run)
    waiting = list(runs)
    rng.shuffle(waiting)
    operator = f"deployment/{env.operator}"
    for _ in range(OPERATOR_KILLS):
        time.sleep(rng.uniform(0.0, 5.0))  # a random moment of the operator's life
        env.kubectl("delete", "pods", "-l", OPERATOR_PODS, "--grace-period=0", "--force")
        # Some runs finish while no operator watches them.
        for _ in range(max(1, len(runs) // OPERATOR_KILLS)):
            if waiting:
                campaign.release(waiting.pop())
        campaign.look()
        env.kubectl("rollout", "status", operator, "--timeout=300s", timeout=330)
    for run in waiting:
        campaign.release(run)
    ended = campaign.wait_ended(runs)
    counts: Counter[str] = Counter()
    campaign.check(ended, counts)
    for run, body in ended.items():
        done = status(body)
        # No pod was lost: one pod per run, whatever happened to the operator.
        assert done["attempt"] == 1 and not done.get("restarts"), (run, done)
        counts["runs with one pod and no restart"] += 1
    campaign.sections["Real node: operator kills"] = "\n".join(
        [
            f"The operator's pod force-deleted {OPERATOR_KILLS} times, at random moments, "
            f"while {OPERATOR_RUNS} runs were in their tool calls; after each kill some runs "
            "were let finish while no operator watched.",
            "",
            _table(counts),
        ]
    )


def test_the_store_down_for_a_minute_under_running_runs(campaign: Campaign) -> None:
    env = campaign.env
    runs = [f"outage-{SEED}-{i:03d}" for i in range(OUTAGE_RUNS)]
    for run in runs:
        campaign.start(run)
    for run in runs:
        campaign.wait_started(run)
    [minio] = [
        p
        for p in json.loads(env.kubectl("get", "pods", "-o", "json").stdout)["items"]
        if p["metadata"]["name"].endswith("-minio-0")
    ]
    node, container = campaign.node_of(minio), _container(minio, "minio")
    node.ctr("tasks", "pause", container)
    try:
        # The calls finish while the store does not answer: nothing can be saved.
        for run in runs:
            campaign.release(run)
        deadline = time.monotonic() + OUTAGE_SECONDS
        while time.monotonic() < deadline:
            campaign.look()
            time.sleep(1.0)  # pacing: the outage lasts its length whatever happens
    finally:
        node.ctr("tasks", "resume", container)
    ended = campaign.wait_ended(runs)
    reasons: Counter[str] = Counter()
    for run in runs:
        for event in _events(env, run):
            if event["reason"] == "PodLost":
                reason = event["message"].split("(")[-1].rstrip(")")
                reasons[reason] += int(event.get("count") or 1)
                # A pod whose saves the outage refused exits retryable: a loss the
                # campaign caused. Any other restart would not be.
                if reason == "RetryableError":
                    campaign.inflicted[run] += int(event.get("count") or 1)
    counts: Counter[str] = Counter()
    campaign.check(ended, counts)
    campaign.sections["Real node: store outage"] = "\n".join(
        [
            f"The store (MinIO in the cluster) frozen for {OUTAGE_SECONDS} s while {OUTAGE_RUNS} "
            "runs were in their tool calls, the calls let finish at its start. Pods lost to "
            f"it: {dict(reasons) or 'none'}.",
            "",
            _table(counts),
        ]
    )


def test_a_silent_node_and_its_zombie_writer(campaign: Campaign) -> None:
    env = campaign.env
    cluster = env.real_node
    doomed = cluster.add_node()
    run = f"silent-{SEED}"
    try:
        cluster.kubectl("cordon", "node-0")
        try:
            # What a user who wants a quick failover sets: the pod leaves an unreachable
            # node after 5 s instead of the default 300 s.
            campaign.start(run, tolerations=QUICK_FAILOVER)
            campaign.wait_started(run)
        finally:
            cluster.kubectl("uncordon", "node-0")
        [first] = campaign.look()[run]
        assert first["spec"]["nodeName"] == doomed.name
        # The node goes silent: its kubelet stops, its containers run on, nothing is
        # garbage-collected (the Node stays). The pod is a zombie that can still write.
        silent_at = time.monotonic()
        doomed.stop_kubelet()
        replaced = wait_for_run(
            env, run, lambda r: int(status(r).get("attempt") or 0) >= 2, "replaced", 900
        )
        seconds = time.monotonic() - silent_at
        assert replaced is not None
        # The zombie's calls now finish: it tries to save their results.
        campaign.release(run)
        campaign.inflicted[run] += 1
        ended = campaign.wait_ended([run])
        counts: Counter[str] = Counter()
        campaign.check(ended, counts)
        done = status(ended[run])
        history = env.history(done["stateId"]) or []
        results = [e["data"] for e in history if e["kind"] == "tool_result"]
        # Its saves were refused: the calls it ran are closed as aborted, never "done".
        assert [r["outcome"] for r in results] == ["aborted"] * CALLS_PER_RUN, results
        assert not any(f"{call} done" in json.dumps(results) for call in campaign.calls(run))
        counts["zombie results refused"] += CALLS_PER_RUN
    finally:
        cluster.remove_node(doomed.name)
    campaign.sections["Real node: silent node and zombie writer"] = "\n".join(
        [
            "The kubelet of the node a run's pod was on stopped, its containers running on "
            "and no PodGC (the Node stayed). The operator replaced the pod on the other "
            f"node {seconds:.0f} s after the node went silent (the node is NotReady after "
            "about 40 s; the run tolerates an unreachable node for 5 s, not the default 300; "
            "the operator gives a pod that does not finish terminating 30 s past its "
            "deadline). Then the old pod's calls were let finish: it could not save their "
            "results (its State had been claimed).",
            "",
            _table(counts),
        ]
    )


def _events(env: Environment, run: str) -> list[JSON]:
    listing = env.kubectl(
        "get", "events", f"--field-selector=involvedObject.name={run}", "-o", "json"
    )
    return [
        e for e in json.loads(listing.stdout)["items"] if e["involvedObject"]["kind"] == "AgentRun"
    ]
