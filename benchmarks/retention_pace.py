"""Retention at scale: thousands of finished AgentRuns past their TTL, deleted by one
operator at its pace, while it keeps replacing lost pods of the runs still going.

Run from the repository root, as a section of the benchmarks (10,000 runs, TTL 60 s, the
chart's pace, 20 losses; its rows judged in ``RESULTS.md``)::

    flock /tmp/alpineagents-realnode.lock python -m benchmarks retention [--quick]

or alone, any size (its page ``benchmarks/results/retention.md``)::

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
- **Losses**: ``--losses`` times, spread over the middle half of the deletions (from when
  a quarter of the runs are deleted, so the operator's start is over), a going run's pod
  deleted: its DELETED → its replacement's ADDED; then as many again after the
  deletions, for comparison (the section judges the first against the p95 of lost pods
  replaced in ``RESULTS.md``'s operator row);
- **States**: after, the saved State of every ``Delete`` run is gone and that of every
  ``Keep`` run stays (each read by its id).

Results go to ``benchmarks/results/retention.md``.
"""

from __future__ import annotations

import argparse
import json
import re
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
from .results_page import Page
from .sizes import Sizes

if TYPE_CHECKING:
    from collections.abc import Callable

    from tests.bench.operator_process import Event, EventLog

RESULTS = REPO / "benchmarks" / "results" / "retention.md"
LOSS_P95_FALLBACK = 0.34
"""Seconds: RESULTS.md's operator row (30 pods lost at once, p95) when it was written."""
_REPLACED = re.compile(
    r"(?P<what>[^;]*lost at once): replaced in p50 [0-9.]+ s, p95 (?P<p95>[0-9.]+) s"
)
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

    def make(self, name: str, delete_state: bool) -> str:
        """Make the finished run ``name`` and its saved State; the State's id."""
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
        state_id = state_id_for(NAMESPACE, name, uid)
        self._store.save(State(state_id, [Message.user(name)]))
        self._custom.patch_namespaced_custom_object_status(
            "alpineagents.dev", "v1", NAMESPACE, "agentruns", name, {"status": _ended()}
        )
        return state_id


def _added(name: str) -> Callable[[Event], bool]:
    return lambda event: event.type == "ADDED" and event.name == name


def _deleted(name: str) -> Callable[[Event], bool]:
    return lambda event: event.type == "DELETED" and event.name == name


def _finalized(name: str) -> Callable[[Event], bool]:
    return lambda event: event.name == name and bool(event.object["metadata"].get("finalizers"))


class _Deletions:
    """The ``done-`` runs' DELETED events as they arrive, read once each (thousands of
    them: :meth:`EventLog.wait_for` would scan the whole log for every one)."""

    def __init__(self, events: EventLog) -> None:
        self._events = events
        self._seen = 0
        self.names: set[str] = set()
        self.first: Event | None = None
        self.last: Event | None = None

    def wait(self, count: int, deadline: float) -> None:
        """Until ``count`` runs are deleted (or the safety net's ``deadline``)."""
        while len(self.names) < count and time.monotonic() < deadline:
            fresh = self._events.since(self._seen, 10.0)
            self._seen += len(fresh)
            for event in fresh:
                if event.type == "DELETED" and event.name.startswith("done-"):
                    self.names.add(event.name)
                    self.first = self.first or event
                    self.last = event


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
                ids = list(pool.map(lambda n: maker.make(n, int(n[-5:]) % 2 == 0), names))
            creating = time.monotonic() - began
            print(f"{runs} finished runs made in {creating:.0f} s", flush=True)

            deletions = _Deletions(events)
            deadline = time.monotonic() + DEADLINE
            # Spread the losses over the middle half of the deletions, from when a quarter
            # are deleted (the operator's start, kopf handing it every run, long over).
            spacing = max(1.0, runs / rate / 2 / max(1, losses))
            lost: list[float] = []
            stop = threading.Event()

            def lose_pods(count: int, every: float) -> None:
                for n in range(count):
                    if stop.wait(every):
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

            started = time.monotonic()
            operator.start()
            deletions.wait(max(1, runs // 4), deadline)
            loser = threading.Thread(target=lose_pods, args=(losses, spacing), daemon=True)
            loser.start()
            deletions.wait(runs, deadline)
            stop.set()
            loser.join(120)
            during = list(lost)
            # The same losses with nothing left to delete: what the deletions cost them.
            lost.clear()
            stop.clear()
            lose_pods(losses, 1.0)
            after = list(lost)
            operator.stop()
        kept = {state_id for state_id in ids if store.read(state_id) is not None}
    first, last = deletions.first, deletions.last
    seconds = last.at - first.at if first and last else 0.0
    keep = {state_id for n, state_id in enumerate(ids) if n % 2 == 1}
    return {
        "runs": runs,
        "ttl": ttl,
        "rate": rate,
        "creating_seconds": creating,
        "start_to_first_delete": first.at - started if first else float("nan"),
        "deleted": len(deletions.names),
        "delete_seconds": seconds,
        "deletes_per_second": (len(deletions.names) - 1) / seconds if seconds > 0 else 0.0,
        "losses": during,
        "losses_after": after,
        "states_left": len(kept),
        "states_expected": len(keep),  # the Keep half
        "states_wrong": len(kept ^ keep),  # a Keep State gone, or a Delete State left
    }


def report(result: dict[str, Any]) -> str:
    def loss_text(losses: list[float]) -> str:
        if not losses:
            return "none measured"
        return (
            f"median {statistics.median(losses):.2f} s, max {max(losses):.2f} s over {len(losses)}"
        )

    states_ok = result["states_wrong"] == 0
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


def _operator_loss_p95() -> tuple[float, str]:
    """The p95 of lost pods replaced in ``RESULTS.md``'s operator row (its record), the
    figure a loss during the deletions is judged against; and where it comes from."""
    from .record import load

    record = load(REPO / "benchmarks", "operator")
    row = record.rows.get("operator-scale") if record else None
    found = _REPLACED.search(row.measured) if row else None
    if found is None:
        return LOSS_P95_FALLBACK, f"{LOSS_P95_FALLBACK:.2f} s (no operator record)"
    return float(found["p95"]), f"{found['what'].strip()}: p95 {float(found['p95']):.2f} s"


def section(page: Page, work: Path, repeats: int, sizes: Sizes, postgres: str | None) -> None:
    """Issue 42: ``sizes.retention_runs`` finished runs past their TTL, deleted at the
    chart's pace while lost pods are replaced; their States as ``onDelete`` says."""
    from .measure import percentile
    from .operator_scale import PlaneUnavailable
    from .results_page import Row

    del repeats, postgres
    n, rate = sizes.retention_runs, float(_chart_retention()["deletesPerSecond"])
    ttl = sizes.retention_ttl
    limit, limit_text = _operator_loss_p95()
    whats = {
        "retention-pace": (
            f"{n:,} finished AgentRuns past a TTL of {ttl} s (issue 42): deleted at the "
            "configured pace"
        ),
        "retention-losses": (
            "a running run's lost pod while those deletions go: DELETED → its replacement "
            "ADDED, p50 / p95"
        ),
        "retention-states": "their saved States after: onDelete Delete gone, Keep kept",
    }
    goals = {
        "retention-pace": f"every run deleted, at 90 to 105 % of the pace ({rate:g} a second)",
        "retention-losses": f"p95 within RESULTS.md's operator row ({limit_text})",
        "retention-states": "every State as its run's onDelete says",
    }
    try:
        result = measure(work, n, ttl, rate, sizes.retention_losses)
    except PlaneUnavailable as error:
        for key, what in whats.items():
            page.rows[key] = Row(what, "-", goals[key], None)
        page.not_measured.append(f"Retention: {error}")
        return
    deleted, pace = result["deleted"], result["deletes_per_second"]
    during, after = result["losses"], result["losses_after"]
    setting = f"retention.enabled (off in the chart), deletesPerSecond {rate:g} (the chart's)"
    page.rows["retention-pace"] = Row(
        whats["retention-pace"],
        f"{deleted:,} of {n:,} deleted, {pace:.2f} a second (first → last "
        f"{result['delete_seconds']:.0f} s); the first "
        f"{result['start_to_first_delete']:.0f} s after the operator's start (the runs "
        f"ended as they were made, {result['creating_seconds']:.0f} s before it; TTL {ttl} s)",
        goals["retention-pace"],
        deleted == n and 0.9 * rate <= pace <= 1.05 * rate,
        f"1 pass: {n:,} runs",
        setting=setting,
    )

    def p50_p95(values: list[float]) -> str:
        if not values:
            return "none measured"
        return f"{percentile(values, 0.5):.2f} / {percentile(values, 0.95):.2f} s"

    page.rows["retention-losses"] = Row(
        whats["retention-losses"],
        f"{p50_p95(during)} over {len(during)}; with nothing left to delete "
        f"{p50_p95(after)} over {len(after)}",
        goals["retention-losses"],
        bool(during) and percentile(during, 0.95) <= limit,
        f"{len(during)} losses, one at a time, spread over the deletions",
        judged_over=len(during),
        setting=setting,
    )
    page.rows["retention-states"] = Row(
        whats["retention-states"],
        f"{result['states_left']:,} left of the {result['states_expected']:,} Keep runs'; "
        f"{result['states_wrong']:,} wrong (a Keep State gone or a Delete State left)",
        goals["retention-states"],
        result["states_wrong"] == 0 and deleted == n,
        f"1 pass: {n:,} runs, half each setting",
        setting=setting,
    )
    page.sections.append(report(result).split("\n")[3:])


def _chart_retention() -> dict[str, Any]:
    import yaml

    values = yaml.safe_load((REPO / "charts" / "alpineagents" / "values.yaml").read_text())
    return dict(values["retention"])


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
