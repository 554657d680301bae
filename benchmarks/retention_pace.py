"""Retention at scale: thousands of finished AgentRuns past their TTL, deleted by one
operator at its pace, while it keeps replacing lost pods of the runs still going.

Run from the repository root::

    python -m benchmarks.retention_pace [--runs 10000] [--ttl 60] [--rate 5] [--losses 5]

The bench's etcd + kube-apiserver only (no node: pods stay Pending), the operator as its
own process (its retention on, ``ALPINEAGENTS_DELETES_PER_SECOND`` = ``--rate``). A
template run is ended with the operator running, so kopf's annotations and (for
``onDelete: Delete``) its finalizer are on it; ``--runs`` finished runs are then made as
the operator would have left them (16 requests at a time, the operator stopped): each
ended at creation, ``ttlSecondsAfterFinished: --ttl``, half ``onDelete: Delete`` (with a
saved State each in the operator's FileStore), half ``Keep`` (with one too). Ten more
runs are going (a Pending pod each). Then the operator starts, and the benchmark watches:

- **Deletes**: the first run's DELETED to the last's: runs a second (the goal: the
  configured pace, not more);
- **Losses**: ``--losses`` times during the deletions (once a quarter of the runs are
  deleted, so the operator's start is over), a going run's pod deleted: its DELETED → its replacement's ADDED;
  then as many again after the deletions, for comparison;
- **States**: after, the saved States of ``Delete`` runs are gone and those of ``Keep``
  runs stay.

Results go to ``benchmarks/results/retention.md``.
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any

from . import REPO
from .operator_runs import CREATORS, control_plane
from .operator_scale import NAMESPACE, Operator

if TYPE_CHECKING:
    from collections.abc import Callable

    from tests.bench.operator_process import Event

RESULTS = REPO / "benchmarks" / "results" / "retention.md"
GOING = 10
DEADLINE = 3600.0  # a safety net on a busy machine, not a measure


def _run(name: str, **spec: Any) -> dict[str, Any]:
    return {
        "apiVersion": "alpineagents.dev/v1",
        "kind": "AgentRun",
        "metadata": {"name": name, "namespace": NAMESPACE},
        "spec": {"model": "claude-sonnet-5", "prompt": f"job {name}", **spec},
    }


def _ended() -> dict[str, Any]:
    stamp = datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%S.000Z")
    return {"phase": "Succeeded", "reason": "Answered", "completedAt": stamp, "attempt": 1}


class _Maker:
    """Finished runs as the operator leaves them (kopf's annotations, the finalizer)."""

    def __init__(self, plane: Any, template: dict[str, Any], store: Any, ttl: int) -> None:
        from kubernetes import client

        api = plane.api_client()
        api.configuration.connection_pool_maxsize = CREATORS
        self._custom = client.CustomObjectsApi(api)
        self._annotations = dict(template["metadata"].get("annotations") or {})
        self._finalizers = list(template["metadata"].get("finalizers") or [])
        self._store = store
        self._ttl = ttl

    def make(self, name: str, delete_state: bool) -> None:
        from alpineagents import Message, State
        from alpineagents.pod_contract import state_id_for

        body = _run(
            name,
            ttlSecondsAfterFinished=self._ttl,
            onDelete="Delete" if delete_state else "Keep",
        )
        body["metadata"]["annotations"] = self._annotations
        if delete_state:
            body["metadata"]["finalizers"] = self._finalizers
        made: Any = self._custom.create_namespaced_custom_object(
            "alpineagents.dev", "v1", NAMESPACE, "agentruns", body
        )
        uid = made["metadata"]["uid"]
        self._store.save(State(state_id_for(NAMESPACE, name, uid), [Message.user(name)]))
        self._custom.patch_namespaced_custom_object_status(
            "alpineagents.dev", "v1", NAMESPACE, "agentruns", name, {"status": _ended()}
        )


def _added(name: str) -> Callable[[Event], bool]:
    return lambda event: event.type == "ADDED" and event.name == name


def _deleted(name: str) -> Callable[[Event], bool]:
    return lambda event: event.type == "DELETED" and event.name == name


def _finalized(name: str) -> Callable[[Event], bool]:
    return lambda event: event.name == name and bool(event.object["metadata"].get("finalizers"))


def _another_deletion(seen: set[str]) -> Callable[[Event], bool]:
    return lambda event: (
        event.type == "DELETED" and event.name.startswith("done-") and event.name not in seen
    )


def measure(workdir: Path, runs: int, ttl: int, rate: float, losses: int) -> dict[str, Any]:
    from tests.bench.operator_process import EventLog

    from alpineagents import FileStore

    folder = workdir / "runs"
    folder.mkdir(parents=True)
    store = FileStore(folder)
    with control_plane(workdir) as plane:
        operator = Operator(plane.client_kubeconfig("operator"), folder, workdir / "op.log")
        operator.env.update(
            ALPINEAGENTS_RETENTION="true",
            ALPINEAGENTS_DELETES_PER_SECOND=str(rate),
            ALPINEAGENTS_LOG_LEVEL="INFO",
        )
        api = plane.api_client()
        with (
            EventLog(api, NAMESPACE, "agentruns") as events,
            EventLog(api, NAMESPACE, "pods") as pods,
        ):
            operator.start()
            going = [f"going-{n}" for n in range(GOING)]
            template = _run("template", onDelete="Delete", ttlSecondsAfterFinished=10**9)
            plane.kubectl(
                "create", "-f", "-",
                input="\n---\n".join(json.dumps(r) for r in [template, *map(_run, going)]),
            )  # fmt: skip
            for name in ["template", *going]:
                pods.wait_for(_added(f"{name}-1"))
            events.wait_for(_finalized("template"))
            operator.stop()
            body = json.loads(
                plane.kubectl("get", "agentrun", "template", "-n", NAMESPACE, "-o", "json").stdout
            )
            maker = _Maker(plane, body, store, ttl)
            names = [f"done-{n:05d}" for n in range(runs)]
            began = time.monotonic()
            with ThreadPoolExecutor(CREATORS) as pool:
                list(pool.map(lambda n: maker.make(n, int(n[-5:]) % 2 == 0), names))
            creating = time.monotonic() - began
            print(f"{runs} finished runs made in {creating:.0f} s", flush=True)

            started = time.monotonic()
            operator.start()
            first = events.wait_for(_another_deletion(set()))
            lost: list[float] = []
            stop = threading.Event()

            def lose_pods() -> None:
                # Once a quarter of the runs are deleted: the operator's start (kopf
                # handing it every run) is long over, and a loss meets the deletions alone.
                while len(deleted) < runs // 4 and not stop.wait(0.5):
                    pass
                for n in range(losses):
                    if stop.wait(5.0):
                        return
                    run = going[n % GOING]
                    status = json.loads(
                        plane.kubectl("get", "agentrun", run, "-n", NAMESPACE, "-o", "json").stdout
                    )["status"]
                    attempt = int(status["attempt"])
                    after = time.monotonic()
                    plane.kubectl(
                        "delete", "pod", f"{run}-{attempt}", "-n", NAMESPACE, "--wait=false"
                    )
                    gone = pods.wait_for(_deleted(f"{run}-{attempt}"), after)
                    added = pods.wait_for(_added(f"{run}-{attempt + 1}"), after)
                    lost.append(added.at - gone.at)

            deleted: set[str] = set()
            loser = threading.Thread(target=lose_pods, daemon=True)
            loser.start()
            last = first
            deadline = time.monotonic() + DEADLINE
            while len(deleted) < runs and time.monotonic() < deadline:
                event = events.wait_for(_another_deletion(deleted), first.at)
                deleted.add(event.name)
                last = event
            stop.set()
            loser.join(120)
            during = list(lost)
            # The same losses with nothing left to delete: what the deletions cost them.
            lost.clear()
            stop.clear()
            lose_pods()
            after = list(lost)
            operator.stop()
        kept = sum(1 for _ in folder.iterdir() if not _.name.startswith("."))
    seconds = last.at - first.at
    return {
        "runs": runs,
        "ttl": ttl,
        "rate": rate,
        "creating_seconds": creating,
        "start_to_first_delete": first.at - started,
        "delete_seconds": seconds,
        "deletes_per_second": (runs - 1) / seconds if seconds > 0 else float("inf"),
        "losses": during,
        "losses_after": after,
        "states_left": kept,
        "states_expected": runs // 2,  # the Keep half
    }


def report(result: dict[str, Any]) -> str:
    def loss_text(losses: list[float]) -> str:
        if not losses:
            return "none measured"
        return (
            f"median {statistics.median(losses):.2f} s, max {max(losses):.2f} s over {len(losses)}"
        )

    states_ok = result["states_left"] == result["states_expected"]
    return "\n".join(
        [
            "# Retention: finished runs deleted at the operator's pace",
            "",
            "Written by `python -m benchmarks.retention_pace "
            f"--runs {result['runs']} --ttl {result['ttl']} --rate {result['rate']:g} "
            f"--losses {len(result['losses_after'])}` "
            "(see its docstring). The bench's kube-apiserver, no node; 2 CPUs shared with "
            "the apiserver and etcd.",
            "",
            "| measure | value |",
            "|---|---|",
            f"| finished runs past their TTL | {result['runs']:,} (half onDelete: Delete) |",
            f"| configured pace (`retention.deletesPerSecond`) | {result['rate']:g} a second |",
            f"| operator start → first deletion | {result['start_to_first_delete']:.1f} s |",
            f"| first → last deletion | {result['delete_seconds']:.0f} s |",
            f"| deletions a second | {result['deletes_per_second']:.2f} |",
            f"| a lost pod replaced, meanwhile (DELETED → ADDED) | {loss_text(result['losses'])} |",
            f"| the same, after the deletions | {loss_text(result['losses_after'])} |",
            f"| saved States left / expected (the Keep half) | {result['states_left']:,} / "
            f"{result['states_expected']:,} ({'as the setting says' if states_ok else 'WRONG'}) |",
            "",
        ]
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=10_000)
    parser.add_argument("--ttl", type=int, default=60)
    parser.add_argument("--rate", type=float, default=5.0)
    parser.add_argument("--losses", type=int, default=5)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="retention-") as work:
        result = measure(Path(work), args.runs, args.ttl, args.rate, args.losses)
    text = report(result)
    RESULTS.write_text(text)
    print(text)


if __name__ == "__main__":
    main()
