"""MinioStore against a real MinIO (and SeaweedFS): what a save and a load cost.

Run from the repository root::

    python benchmarks/minio_store.py [--servers minio,seaweedfs] [--sizes 1000,10000,100000]

It starts the test bench's servers on loopback ports in temp dirs, measures, stops them,
and writes ``benchmarks/results/minio_store.md``. Measured:

1. Bytes sent per save next to the bytes of the new entries, at two history lengths
   (hot path: one slot create; amortized: with the background merges those saves caused).
2. Save latency next to one raw ``put_object`` of the same segment bytes, interleaved in
   one run so both see the same server and machine state.
3. Load time (fresh MinioStore, as in a new process) of histories of 1k/10k/100k
   entries of about 300 bytes, with the number of requests it took; FileStore alongside.
4. How long a save takes to fail when the server is down (retry_budget=2s).
"""

from __future__ import annotations

import argparse
import functools
import io
import json
import platform
import shutil
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from . import REPO

sys.path[:0] = [str(REPO), str(REPO / "operator")]

import urllib3  # noqa: E402
from minio import Minio  # noqa: E402
from tests.bench.minio_server import S3Server, start_minio  # noqa: E402
from tests.bench.seaweedfs_server import start_seaweedfs  # noqa: E402

from alpineagents import FileStore, Message, State  # noqa: E402
from alpineagents.store.s3 import MinioStore, StoreUnavailableError  # noqa: E402

RESULTS = REPO / "benchmarks" / "results" / "minio_store.md"
TEXT = "The build of service {n} finished; 3 warnings in the linker step, all tests green."


@dataclass
class Meter:
    """Counts the requests and bytes a client's HTTP pool sends."""

    pool: urllib3.PoolManager
    requests: int = 0
    sent: int = 0
    by_method: dict[str, int] = field(default_factory=dict)

    def __post_init__(self) -> None:
        original = self.pool.urlopen

        def urlopen(method: str, url: str, *args: Any, **kw: Any) -> Any:
            self.requests += 1
            self.sent += len(kw.get("body") or b"")
            self.by_method[method] = self.by_method.get(method, 0) + 1
            return original(method, url, *args, **kw)

        self.pool.urlopen = urlopen  # type: ignore[method-assign]

    def mark(self) -> tuple[int, int]:
        return self.requests, self.sent


def metered_store(server: S3Server, bucket: str, **options: Any) -> tuple[MinioStore, Meter]:
    pool = MinioStore.http_client(timeout=5.0)
    client = Minio(
        server.endpoint,
        access_key=server.access_key,
        secret_key=server.secret_key,
        secure=False,
        region="us-east-1",
        http_client=pool,
    )
    return MinioStore(client, bucket, "runs", **options), Meter(pool)


def entry_state(state_id: str) -> State:
    return State(state_id, messages=[Message.user("Summarise the nightly builds")])


def send(state: State, n: int) -> int:
    """Add one ~300-byte entry; return its size as stored (one JSON line)."""
    added = state.send(TEXT.format(n=n))
    return len(json.dumps(added.to_dict(), separators=(",", ":")).encode()) + 1


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


# ------------------------------------------------------------------ 1. bytes per save
def bytes_per_save(server: S3Server, bucket: str, lengths: list[int]) -> list[dict[str, Any]]:
    rows = []
    for length in lengths:
        store, meter = metered_store(server, bucket)
        state = entry_state(f"bytes-{length}")
        store.save(state)
        for n in range(length - 100):
            send(state, n)
            if n % 50 == 49 or n == length - 101:
                store.save(state)  # 50 entries a save, to get to the length quickly
        # Now 100 single-entry saves at this length, measured one by one.
        hot_bytes: list[int] = []
        entry_bytes = 0
        start_requests, start_sent = meter.mark()
        for n in range(100):
            size = send(state, length + n)
            entry_bytes += size
            requests, sent = meter.mark()
            store.save(state)
            after_requests, after_sent = meter.mark()
            if after_requests - requests == 1:
                hot_bytes.append(after_sent - sent)
        end_requests, end_sent = meter.mark()
        all_bytes = end_sent - start_sent
        rows.append(
            {
                "length": length,
                "entry": entry_bytes / 100,
                "hot": statistics.mean(hot_bytes),
                "amortized": all_bytes / 100,
                "requests": (end_requests - start_requests) / 100,
                "hot_share": len(hot_bytes) / 100,
            }
        )
    return rows


# ------------------------------------------------------------------ 2. latency
def latency(server: S3Server, bucket: str, saves: int = 1000) -> dict[str, float]:
    store, _ = metered_store(server, bucket)
    raw = server.client()
    state = entry_state("latency")
    store.save(state)
    save_times, put_times = [], []
    for n in range(saves):
        send(state, n)
        line = state.history[-1].to_dict()
        body = (json.dumps(line, separators=(",", ":")) + "\n").encode()
        begin = time.perf_counter()
        store.save(state)
        save_times.append(time.perf_counter() - begin)
        begin = time.perf_counter()
        raw.put_object(bucket, f"raw/{n:06d}.jsonl", io.BytesIO(body), len(body))
        put_times.append(time.perf_counter() - begin)
    return {
        "save_p50": percentile(save_times, 0.5) * 1000,
        "save_p90": percentile(save_times, 0.9) * 1000,
        "save_p99": percentile(save_times, 0.99) * 1000,
        "save_mean": statistics.mean(save_times) * 1000,
        "put_p50": percentile(put_times, 0.5) * 1000,
        "put_p90": percentile(put_times, 0.9) * 1000,
        "put_p99": percentile(put_times, 0.99) * 1000,
        "put_mean": statistics.mean(put_times) * 1000,
    }


# ------------------------------------------------------------------ 3. load
def build(store: Any, state_id: str, size: int) -> State:
    """A history of ``size`` entries, saved in about 1,000 saves (so merges happened)."""
    state = entry_state(state_id)
    store.save(state)
    per_save = max(1, size // 1000)
    while len(state.history) < size:
        for _ in range(min(per_save, size - len(state.history))):
            send(state, len(state.history))
        store.save(state)
    return state


def timed(call: Callable[[], Any], repeat: int) -> tuple[float, Any]:
    times, result = [], None
    for _ in range(repeat):
        begin = time.perf_counter()
        result = call()
        times.append(time.perf_counter() - begin)
    return statistics.median(times), result


def load_times(
    server: S3Server, bucket: str, sizes: list[int], workdir: Path
) -> list[dict[str, Any]]:
    rows = []
    for size in sizes:
        writer, _ = metered_store(server, bucket)
        state = build(writer, f"load-{size}", size)
        file_store = FileStore(workdir / f"file-{size}")
        file_state = build(file_store, "load", size)
        repeat = 5 if size <= 10_000 else 3

        def fresh_load(size: int = size) -> tuple[State, Meter]:
            reader, meter = metered_store(server, bucket)
            return reader.load(f"load-{size}"), meter

        seconds, (loaded, meter) = timed(fresh_load, repeat)
        assert loaded == state, "a load must give back the State that was saved"
        reader, _ = metered_store(server, bucket)
        read_seconds, record = timed(functools.partial(reader.read, f"load-{size}"), repeat)
        segments = len(
            [
                o
                for o in server.client().list_objects(
                    bucket, prefix=f"runs/load-{size}/", recursive=True
                )
                if str(o.object_name).endswith(".jsonl")
            ]
        )
        file_seconds, file_loaded = timed(functools.partial(file_store.load, "load"), repeat)
        assert file_loaded == file_state
        rows.append(
            {
                "size": size,
                "bytes": sum(len(json.dumps(e, separators=(",", ":"))) + 1 for e in record.entries),
                "load": seconds * 1000,
                "read": read_seconds * 1000,
                "requests": meter.requests,
                "segments": segments,
                "file_load": file_seconds * 1000,
            }
        )
    return rows


# ------------------------------------------------------------------ 4. outage
def outage(server: S3Server, bucket: str) -> float:
    store = MinioStore.connect(
        server.endpoint,
        bucket,
        "runs",
        access_key=server.access_key,
        secret_key=server.secret_key,
        secure=False,
        retry_budget=2.0,
        timeout=1.0,
    )
    state = entry_state("outage")
    store.save(state)
    server.stop()
    try:
        send(state, 0)
        begin = time.perf_counter()
        try:
            store.save(state)
        except StoreUnavailableError:
            return time.perf_counter() - begin
        raise AssertionError("a save with the server down must fail")
    finally:
        server.start()


# ------------------------------------------------------------------ report
def run(kind: str, sizes: list[int], workdir: Path) -> dict[str, Any]:
    start = start_minio if kind == "minio" else start_seaweedfs
    server_dir = workdir / kind
    server_dir.mkdir()
    server = start(server_dir, "bench-access", "bench-secret-0123456789")
    try:
        bucket = server.fresh_bucket()
        print(f"[{kind}] bytes per save", flush=True)
        bytes_rows = bytes_per_save(server, bucket, [1_000, 10_000])
        print(f"[{kind}] latency", flush=True)
        lat = latency(server, bucket)
        print(f"[{kind}] load", flush=True)
        loads = load_times(server, bucket, sizes, workdir / f"{kind}-files")
        print(f"[{kind}] outage", flush=True)
        down = outage(server, bucket)
        return {"bytes": bytes_rows, "latency": lat, "load": loads, "outage": down}
    finally:
        server.stop()


def report(results: dict[str, dict[str, Any]]) -> str:
    lines = [
        "# MinioStore benchmark",
        "",
        f"Written by `benchmarks/minio_store.py` on {time.strftime('%Y-%m-%d')}, "
        f"{platform.machine()}, {_cpus()} CPUs, Python {platform.python_version()}; "
        "servers are the test bench's (single process, loopback, local disk). Entries are "
        "message entries of about 300 bytes as stored.",
        "",
        f"The machine was shared with other work (load average {_load()} at the end of "
        "the run, on 2 cores): absolute times are noisy, the side-by-side ratios and the "
        "byte and request counts are what to read.",
        "",
    ]
    for kind, result in results.items():
        lat = result["latency"]
        lines += [
            f"## {kind}",
            "",
            "### Bytes sent per save (one new entry each)",
            "",
            "| history length | new entry (B) | hot-path save (B) | amortized with merges (B) "
            "| requests per save (amortized) | saves on the 1-request hot path |",
            "|---:|---:|---:|---:|---:|---:|",
        ]
        for row in result["bytes"]:
            lines.append(
                f"| {row['length']:,} | {row['entry']:.0f} | {row['hot']:.0f} | "
                f"{row['amortized']:.0f} | {row['requests']:.2f} | {row['hot_share']:.0%} |"
            )
        lines += [
            "",
            "The hot path is one conditional PUT of a slot: a header line (the Store info, "
            "~400 B, and ~100 B of fencing fields) and the new entry; it does not grow with "
            "the history. The amortized column adds the merges those saves triggered "
            "(they run on a thread of their own; the same HTTP pool counts them).",
            "",
            "### Save latency next to one raw PUT of the same bytes (same run, interleaved)",
            "",
            "| | p50 (ms) | p90 (ms) | p99 (ms) | mean (ms) |",
            "|---|---:|---:|---:|---:|",
            f"| `store.save(state)` | {lat['save_p50']:.2f} | {lat['save_p90']:.2f} | "
            f"{lat['save_p99']:.2f} | {lat['save_mean']:.2f} |",
            f"| raw `put_object` | {lat['put_p50']:.2f} | {lat['put_p90']:.2f} | "
            f"{lat['put_p99']:.2f} | {lat['put_mean']:.2f} |",
            f"| ratio | {lat['save_p50'] / lat['put_p50']:.2f}x | "
            f"{lat['save_p90'] / lat['put_p90']:.2f}x | {lat['save_p99'] / lat['put_p99']:.2f}x "
            f"| {lat['save_mean'] / lat['put_mean']:.2f}x |",
            "",
            "### Load (fresh MinioStore, as in a new process; median)",
            "",
            "| entries | history bytes | `load` (ms) | of which `read` (ms) | requests "
            "| segments stored | FileStore `load` (ms) |",
            "|---:|---:|---:|---:|---:|---:|---:|",
        ]
        for row in result["load"]:
            lines.append(
                f"| {row['size']:,} | {row['bytes'] / 1e6:.1f} MB | {row['load']:.0f} | "
                f"{row['read']:.0f} | {row['requests']} | {row['segments']} | "
                f"{row['file_load']:.0f} |"
            )
        lines += [
            "",
            "Each history was written in about 1,000 saves (1, 10 and 100 entries a save), "
            "so merges had run. Requests include the one bucket check of a fresh store.",
            "",
            f"### Store down: a save failed after {result['outage']:.2f} s "
            "(retry_budget=2 s, timeout=1 s)",
            "",
        ]
    return "\n".join(lines)


def _load() -> str:
    import os

    return " / ".join(f"{value:.1f}" for value in os.getloadavg())


def _cpus() -> int:
    import os

    return os.cpu_count() or 0


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--servers", default="minio,seaweedfs")
    parser.add_argument("--sizes", default="1000,10000,100000")
    parser.add_argument("--output", default=str(RESULTS))
    args = parser.parse_args()
    sizes = [int(size) for size in args.sizes.split(",")]
    workdir = Path(tempfile.mkdtemp(prefix="alpineagents-bench-"))
    try:
        results = {kind: run(kind, sizes, workdir) for kind in args.servers.split(",")}
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
    text = report(results)
    Path(args.output).parent.mkdir(parents=True, exist_ok=True)
    Path(args.output).write_text(text + "\n")
    print(text)


if __name__ == "__main__":
    main()
