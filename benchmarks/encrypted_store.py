"""What encryption at rest costs: EncryptedStore next to the store it wraps, in one run.

``python benchmarks/encrypted_store.py`` (from the repository root) measures, for
FileStore and (when the bench's MinIO is built) MinioStore, plain and encrypted side by
side, interleaved:

- bytes stored per entry (one sealed entry next to the same entry in the clear);
- a one-entry save, as CPU time of this process (what encrypting adds; the store's own
  I/O waits are not CPU time) and as wall time;
- a load of a 1,000 and a 10,000 entry history by a fresh store, CPU and wall time.

It writes ``benchmarks/results/encrypted_store.md``. On a shared machine the absolute
times are noisy: read the ratios, which come from the same run.
"""

from __future__ import annotations

import functools
import json
import os
import platform
import statistics
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from datetime import date
from pathlib import Path

from . import REPO

sys.path[:0] = [str(REPO / "operator"), str(REPO)]

from alpineagents import FileStore, Message, State, Store  # noqa: E402
from alpineagents.store.encrypted import EncryptedStore, Keyring  # noqa: E402
from alpineagents.testing import MemoryStore  # noqa: E402

RESULTS = REPO / "benchmarks" / "results" / "encrypted_store.md"
SAVES = 200
LOADS = (1_000, 10_000)
KEYRING = Keyring([("k1", bytes(range(32)))])
TEXT = "Summarise the incident report for the on-call channel and list the follow-ups. " * 3


def one_entry_state(state_id: str, store: Store) -> State:
    state = State(state_id, messages=[Message.user(TEXT)])
    store.save(state)
    return state


def timed(call: Callable[[], object]) -> tuple[float, float]:
    """(CPU seconds of this process, wall seconds) of one call."""
    cpu, wall = time.process_time(), time.perf_counter()
    call()
    return time.process_time() - cpu, time.perf_counter() - wall


def saves(plain: Store, sealed: Store) -> dict[str, tuple[float, float]]:
    """Median (CPU ms, wall ms) of a one-entry save, plain and sealed, interleaved."""
    states = {
        "plain": one_entry_state("s-plain", plain),
        "sealed": one_entry_state("s-sealed", sealed),
    }
    stores = {"plain": plain, "sealed": sealed}
    samples: dict[str, list[tuple[float, float]]] = {"plain": [], "sealed": []}
    for number in range(SAVES):
        for kind in ("plain", "sealed") if number % 2 else ("sealed", "plain"):
            states[kind].send(f"{TEXT} ({number})")
            samples[kind].append(timed(functools.partial(stores[kind].save, states[kind])))
    return {
        kind: (
            statistics.median(s[0] for s in values) * 1000,
            statistics.median(s[1] for s in values) * 1000,
        )
        for kind, values in samples.items()
    }


def loads(
    make: Callable[[], Store], wrap: Callable[[Store], Store], entries: int
) -> dict[str, tuple[float, float]]:
    """(CPU ms, wall ms) of a load by a fresh store, plain and sealed (median of 3)."""
    results = {}
    for kind, fresh in (("plain", make), ("sealed", lambda: wrap(make()))):
        writer = fresh()
        state = State(f"load-{kind}-{entries}", messages=[Message.user(TEXT)])
        for number in range(entries - 1):
            state.send(f"{TEXT} ({number})")
            if number % (entries // 100) == 0:
                writer.save(state)  # about a hundred saves: a realistic number of segments
        writer.save(state)
        samples = [timed(functools.partial(_load_fresh, fresh, state.id)) for _ in range(3)]
        results[kind] = (
            statistics.median(s[0] for s in samples) * 1000,
            statistics.median(s[1] for s in samples) * 1000,
        )
    return results


def _load_fresh(fresh: Callable[[], Store], state_id: str) -> State:
    return fresh().load(state_id)


def entry_bytes() -> tuple[int, int]:
    """(plain, sealed) bytes of one message entry as a store keeps it."""
    plain_store, sealed_inner = MemoryStore(), MemoryStore()
    plain_store.save(State("bytes", messages=[Message.user(TEXT)]))
    EncryptedStore(sealed_inner, KEYRING).save(State("bytes", messages=[Message.user(TEXT)]))

    def size(store: MemoryStore) -> int:
        return len(json.dumps(store.records["bytes"].entries[0], separators=(",", ":")))

    return size(plain_store), size(sealed_inner)


@contextmanager
def minio_stores() -> Iterator[tuple[Callable[[], Store], str] | None]:
    try:
        from tests.bench.minio_server import start_minio
        from tests.bench.testbin import binary_path

        binary_path("minio")
    except Exception:
        yield None
        return
    from alpineagents.store.s3 import MinioStore

    workdir = Path(tempfile.mkdtemp(prefix="bench-encrypted-"))
    server = start_minio(workdir, "bench-access", "bench-secret-" + os.urandom(8).hex())
    server.start()
    try:
        server.client().make_bucket("encrypted-bench")
        yield (
            lambda: MinioStore.connect(
                server.endpoint,
                "encrypted-bench",
                "runs",
                access_key=server.access_key,
                secret_key=server.secret_key,
                secure=False,
            ),
            "minio",
        )
    finally:
        server.stop()


def section(name: str, make: Callable[[], Store], lines: list[str]) -> None:
    def wrap(store: Store) -> Store:
        return EncryptedStore(store, KEYRING)

    save = saves(make(), wrap(make()))
    lines += [
        f"## {name}",
        "",
        f"### One-entry save (median of {SAVES}, plain and encrypted interleaved)",
        "",
        "| | CPU (ms) | wall (ms) |",
        "|---|---:|---:|",
        f"| plain | {save['plain'][0]:.3f} | {save['plain'][1]:.3f} |",
        f"| encrypted | {save['sealed'][0]:.3f} | {save['sealed'][1]:.3f} |",
        f"| ratio | {save['sealed'][0] / save['plain'][0]:.2f}x | "
        f"{save['sealed'][1] / save['plain'][1]:.2f}x |",
        "",
        "### Load by a fresh store (median of 3)",
        "",
        "| entries | plain CPU (ms) | encrypted CPU (ms) | CPU ratio | plain wall (ms) "
        "| encrypted wall (ms) | wall ratio |",
        "|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for entries in LOADS:
        load = loads(make, wrap, entries)
        lines.append(
            f"| {entries:,} | {load['plain'][0]:.1f} | {load['sealed'][0]:.1f} | "
            f"{load['sealed'][0] / load['plain'][0]:.2f}x | {load['plain'][1]:.1f} | "
            f"{load['sealed'][1]:.1f} | {load['sealed'][1] / load['plain'][1]:.2f}x |"
        )
    lines.append("")


def main() -> None:
    plain_bytes, sealed_bytes = entry_bytes()
    lines = [
        "# EncryptedStore benchmark",
        "",
        f"Written by `benchmarks/encrypted_store.py` on {date.today()}, {platform.machine()}, "
        f"{os.cpu_count()} CPUs, Python {platform.python_version()}; AES-256-GCM from "
        f"`cryptography`. Plain and encrypted are measured in the same run, interleaved; the "
        f"load average was {' / '.join(f'{x:.1f}' for x in os.getloadavg())} at the start "
        f"(a shared machine): read the ratios.",
        "",
        f"One message entry of {plain_bytes} B in the clear is {sealed_bytes} B sealed "
        f"({sealed_bytes / plain_bytes:.2f}x: a 12-byte nonce and 16-byte tag, base64, and "
        f"the key id beside it).",
        "",
    ]
    folder = Path(tempfile.mkdtemp(prefix="bench-encrypted-file-"))
    section("FileStore", lambda: FileStore(folder), lines)
    with minio_stores() as minio:
        if minio is None:
            lines += ["## MinioStore", "", "Not measured: the bench's MinIO is not built.", ""]
        else:
            section("MinioStore (the bench's MinIO, loopback)", minio[0], lines)
    RESULTS.write_text("\n".join(lines))
    print(RESULTS.read_text())


if __name__ == "__main__":
    main()
