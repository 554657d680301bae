"""What a fork costs on MinIO: its time and the bytes it writes, by the entries it copies.

Run from the repository root::

    python -m benchmarks.fork_cost [--sizes 100,1000,5000] [--repeats 5]

It starts the bench's MinIO on a loopback port in a temp dir, saves a run of each size
(entries of about 300 bytes, saved in steps as a run saves them), forks it at its last
entry (``alpineagents.fork``: read the source, write the copy as a new State), and
writes ``benchmarks/results/fork.md``. Bytes written are the sizes of the fork's objects
in the bucket once it is saved; the time is the median of ``--repeats`` forks (each to a
new id), with the source's own load beside it.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

from . import REPO

sys.path[:0] = [str(REPO), str(REPO / "operator")]

from alpineagents import Message, State, Store, fork, open_store  # noqa: E402

from .measure import load_average, machine  # noqa: E402

RESULTS = REPO / "benchmarks" / "results" / "fork.md"


def a_long_run(store: Store, state_id: str, size: int) -> None:
    """A run of ``size`` entries of about 300 bytes, saved every 10 entries."""
    state = State(state_id, [Message.user("Go through the logs.")])
    while len(state.history) < size:
        state.send(f"note {len(state.history)}: " + "x" * 280)
        if len(state.history) % 10 == 0:
            store.save(state)
    store.save(state)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.fork_cost")
    parser.add_argument("--sizes", default="100,1000,5000", help="entries of the source runs")
    parser.add_argument("--repeats", type=int, default=5, help="forks of each size (5)")
    args = parser.parse_args(sys.argv[1:] if argv is None else argv)
    sizes = [int(s) for s in args.sizes.split(",")]
    import os

    from tests.bench.minio_server import start_minio

    rows = []
    with tempfile.TemporaryDirectory(prefix="alpineagents-fork-") as folder:
        server = start_minio(Path(folder), "forkbench", "forkbench-secret")
        try:
            bucket = server.fresh_bucket()
            os.environ["AWS_ACCESS_KEY_ID"] = server.access_key
            os.environ["AWS_SECRET_ACCESS_KEY"] = server.secret_key
            store = open_store(f"s3://{bucket}/runs?endpoint={server.endpoint}&secure=false")
            client = server.client()
            for size in sizes:
                source = f"source-{size}"
                a_long_run(store, source, size)
                loads, forks, written = [], [], []
                for repeat in range(args.repeats):
                    began = time.perf_counter()
                    open_store(f"s3://{bucket}/runs?endpoint={server.endpoint}&secure=false").load(
                        source
                    )
                    loads.append(time.perf_counter() - began)
                    began = time.perf_counter()
                    fork(store, source, size - 1, f"fork-{size}-{repeat}")
                    forks.append(time.perf_counter() - began)
                    objects = client.list_objects(
                        bucket, prefix=f"runs/fork-{size}-{repeat}/", recursive=True
                    )
                    written.append(sum(o.size or 0 for o in objects))
                rows.append(
                    f"| {size:,} | {statistics.median(forks):.3f} s | "
                    f"{statistics.median(loads):.3f} s | {statistics.median(written):,.0f} |"
                )
        finally:
            server.stop()
    lines = [
        "# What a fork costs on MinIO",
        "",
        f"Written by `python -m benchmarks.fork_cost --sizes {args.sizes} --repeats "
        f"{args.repeats}` on {time.strftime('%Y-%m-%d')}. Machine: {machine()}; load "
        f"average {load_average()} at the end. Median of {args.repeats} forks per size.",
        "",
        "| entries copied | fork (read + write) | the source's load alone | bytes the fork wrote |",
        "|---:|---:|---:|---:|",
        *rows,
        "",
        "A fork reads the source as a load does and writes the copied entries again as the "
        "new State's (one create, then its merges): time and bytes grow with the entries. "
        "A copy by reference of the source's immutable segments is not built.",
        "",
    ]
    RESULTS.write_text("\n".join(lines), encoding="utf-8")
    print(f"wrote {RESULTS}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
