"""The fault campaign of the runtime (issue 13); it writes docs/reliability.md.

Counts and seed come from the environment; the defaults are the issue's minimums:

- ``ALPINEAGENTS_CAMPAIGN_SEED`` (13): the seed of plans, fault kinds and instants.
- ``ALPINEAGENTS_CAMPAIGN_SIGKILLS`` (300) and ``ALPINEAGENTS_CAMPAIGN_CTRL_CS`` (30):
  faults delivered to runs over a FileStore.
- ``ALPINEAGENTS_CAMPAIGN_S3_SIGKILLS`` (40) and ``ALPINEAGENTS_CAMPAIGN_S3_CTRL_CS`` (10):
  the same over a MinioStore on the bench's MinIO.
"""

from __future__ import annotations

import errno
import io
import json
import os
import re
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from alpineagents import Agent, FileStore, Message, State, Store, tool
from alpineagents.store.s3 import MinioStore
from alpineagents.testing import ModelServer, error, hold, reply, tool_use
from tests.bench.minio_server import S3Server
from tests.bench.small_fs import SmallFilesystem
from tests.campaign.kill_fuzz import KillFuzz
from tests.campaign.report import ReliabilityReport

SEED = int(os.environ.get("ALPINEAGENTS_CAMPAIGN_SEED", "13"))
SIGKILLS = int(os.environ.get("ALPINEAGENTS_CAMPAIGN_SIGKILLS", "300"))
CTRL_CS = int(os.environ.get("ALPINEAGENTS_CAMPAIGN_CTRL_CS", "30"))
S3_SIGKILLS = int(os.environ.get("ALPINEAGENTS_CAMPAIGN_S3_SIGKILLS", "40"))
S3_CTRL_CS = int(os.environ.get("ALPINEAGENTS_CAMPAIGN_S3_CTRL_CS", "10"))
WAIT = 120.0  # seconds an awaited event may take on a loaded machine: a safety net


@pytest.fixture(scope="module")
def reliability_report() -> Iterator[ReliabilityReport]:
    """Collects what this module's campaign ran; writes docs/reliability.md at the end."""
    command = (
        f"ALPINEAGENTS_CAMPAIGN_SEED={SEED} ALPINEAGENTS_CAMPAIGN_SIGKILLS={SIGKILLS} "
        f"ALPINEAGENTS_CAMPAIGN_CTRL_CS={CTRL_CS} ALPINEAGENTS_CAMPAIGN_S3_SIGKILLS="
        f"{S3_SIGKILLS} ALPINEAGENTS_CAMPAIGN_S3_CTRL_CS={S3_CTRL_CS} "
        "python -m pytest tests/runtime/test_campaign.py"
    )
    report = ReliabilityReport(SEED, command)
    yield report
    report.write()


@pytest.fixture
def echo_model() -> Iterator[ModelServer]:
    """The scripted model in echo mode: ``use work {...}`` lines become tool calls."""
    with ModelServer(echo=True) as model:
        yield model


def test_kill_fuzzing_over_a_filestore(
    tmp_path: Path,
    echo_model: ModelServer,
    reliability_report: ReliabilityReport,
    capsys: pytest.CaptureFixture[str],
) -> None:
    folder = tmp_path / "runs"
    fuzz = KillFuzz(
        kind="file",
        store_url=f"file://{folder}",
        open_store=lambda: FileStore(folder),
        child_env={},
        model=echo_model,
        markers=tmp_path / "markers",
        seed=SEED,
    )
    totals = fuzz.run(SIGKILLS, CTRL_CS)
    with capsys.disabled():  # the totals show in every run, captured or not
        print(f"\nkill fuzzing: {totals.line()}")
    reliability_report.kill_fuzz.append(totals)
    assert totals.sigkills >= SIGKILLS and totals.ctrl_cs >= CTRL_CS
    assert totals.compactions > 0  # caching and compaction were on, and compacted


def test_kill_fuzzing_over_minio(
    tmp_path: Path,
    minio: S3Server,
    minio_bucket: str,
    echo_model: ModelServer,
    reliability_report: ReliabilityReport,
    capsys: pytest.CaptureFixture[str],
) -> None:
    def open_store() -> MinioStore:
        return MinioStore.connect(
            minio.endpoint,
            minio_bucket,
            "runs",
            access_key=minio.access_key,
            secret_key=minio.secret_key,
            secure=False,
            retry_budget=60,
        )

    fuzz = KillFuzz(
        kind="minio",
        store_url=f"s3://{minio_bucket}/runs?endpoint={minio.endpoint}&secure=false&retry_budget=60",
        open_store=open_store,
        child_env={
            "AWS_ACCESS_KEY_ID": minio.access_key,
            "AWS_SECRET_ACCESS_KEY": minio.secret_key,
        },
        model=echo_model,
        markers=tmp_path / "markers",
        seed=SEED,
    )
    totals = fuzz.run(S3_SIGKILLS, S3_CTRL_CS)
    with capsys.disabled():  # the totals show in every run, captured or not
        print(f"\nkill fuzzing: {totals.line()}")
    reliability_report.kill_fuzz.append(totals)
    assert totals.sigkills >= S3_SIGKILLS and totals.ctrl_cs >= S3_CTRL_CS
    assert totals.compactions > 0


# ------------------------------------------------------------------ disk full
class Observed(FileStore):
    """A FileStore that lets the test wait for its first failed write (a real ENOSPC)."""

    def __init__(self, folder: Path) -> None:
        super().__init__(folder)
        self.failed = threading.Event()

    def write(
        self,
        state_id: str,
        entries: list[dict[str, Any]],
        info: dict[str, Any],
        *,
        create: bool = False,
    ) -> None:
        try:
            super().write(state_id, entries, info, create=create)
        except OSError:
            self.failed.set()
            raise


def agent_on(store: Store, *tools: Any) -> Agent:
    return Agent(model="claude-sonnet-5", store=store, tools=tools, max_tokens=1024)


def test_disk_full_under_a_filestore(
    small_filesystem: SmallFilesystem,
    model_server: ModelServer,
    monkeypatch: pytest.MonkeyPatch,
    reliability_report: ReliabilityReport,
) -> None:
    for name, value in model_server.env.items():
        monkeypatch.setenv(name, value)
    held: list[str] = []
    store = Observed(small_filesystem.path / "runs")

    # 1. A new State on a full disk: refused whole, nothing half-made left behind.
    small_filesystem.fill(leave=0)
    with pytest.raises(OSError) as refused:
        agent_on(store).run(State("refused", [Message.user("Start")]))
    assert refused.value.errno == errno.ENOSPC
    assert store.list() == [] and sorted(p.name for p in store.folder.iterdir()) == []
    held.append("a new State on a full disk is refused whole: nothing of it is left")
    small_filesystem.free()

    # 2. The disk fills during a turn: the failed save of one result does not stop the
    #    other tool; the save at the end of use_tools raises the store's exception.
    ran: list[str] = []

    @tool
    def report_part(part: str) -> str:
        """Writes one part of the report; part "big" fills the disk first."""
        if part == "big":
            small_filesystem.fill(leave=8 << 10)
            ran.append(part)
            return "x" * (64 << 10)  # its save does not fit in what is left
        store.failed.wait(WAIT)  # the big result's save has failed for real
        ran.append(part)
        return "small part"

    model_server.add(
        reply(tool_use("report_part", {"part": "big"}), tool_use("report_part", {"part": "small"}))
    )
    state = State("report", [Message.user("Write the report in two parts")])
    agent = agent_on(store, report_part)
    with pytest.raises(OSError) as full:
        agent.run(state)
    assert full.value.errno == errno.ENOSPC and store.failed.is_set()
    assert sorted(ran) == ["big", "small"]
    assert [e.outcome for e in state.history if e.kind == "tool_result"] == ["ok", "ok"]
    held.append("a failed save after one tool result does not stop the other tool")
    held.append("a run going well raises the store's exception (OSError ENOSPC)")
    on_disk = store.load(state.id)  # what made it, read back whole (a torn tail is cut)
    assert on_disk.history[: on_disk.saved_entries] == state.history[: on_disk.saved_entries]
    held.append("what was saved before the disk filled loads as it was")

    # 3. The next save catches up once there is space: nothing that failed is lost.
    small_filesystem.free()
    store.save(state)
    assert store.load(state.id) == state
    held.append("the next save writes everything that failed to save")

    # 4. A run that is already failing (the model refuses) on a full disk raises the
    #    original error, with the failed save as a note; then resuming catches up.
    state.send("Add a summary")
    model_server.add(hold(error(400, "bad request")))
    failing = threading.Thread(target=_run_expecting_bad_request, args=(agent, state, held))
    failing.start()
    model_server.wait_for_requests(2, timeout=WAIT)  # the run asks again, and is held
    small_filesystem.fill(leave=0)
    model_server.release()
    failing.join(WAIT)
    assert held[-1].startswith("a failing run raises its own error"), held[-1]
    small_filesystem.free()
    model_server.add(reply("Report written, with a summary."))
    assert agent.run(state) == "Report written, with a summary."
    assert store.load(state.id) == state
    held.append("the resumed run saves everything and answers")

    reliability_report.add_section(
        "Disk full (FileStore)",
        "A FileStore on a 1 MiB tmpfs the test mounts, filled for real (ENOSPC), with the "
        "real anthropic client and the scripted model. What held:\n\n"
        + "\n".join(f"- {line}" for line in held),
    )


def _run_expecting_bad_request(agent: Agent, state: State, held: list[str]) -> None:
    import anthropic

    try:
        agent.run(state)
    except anthropic.BadRequestError as raised:
        notes = getattr(raised, "__notes__", [])
        if notes == ["saving the state also failed: OSError: [Errno 28] No space left on device"]:
            held.append("a failing run raises its own error, noting the failed save")
        elif not notes and state.saved_entries == len(state.history):
            # A save is one small append: it can still fit in the file's last block.
            held.append("a failing run raises its own error (its closing append still fit)")


# ------------------------------------------------------------------ bad input
# Ids a caller might pass, and what a user must see. Ids with dots and slashes are fine:
# stores encode them, so they cannot leave their folder or prefix.
REFUSED_IDS = {
    "a NUL character": "nightly\x00report",
    "a line break": "nightly\nreport",
    "a lone surrogate (not UTF-8)": "nightly\udcffreport",
}
CONFINED_IDS = ["..", "../../outside", "a/b", "/etc/passwd", ".hidden"]
LONG_ID = "x" * 1000


def _good_state(store: Store) -> State:
    state = State("good", [Message.user("Keep me")])
    store.save(state)
    return state


def _unharmed(store: Store, good: State) -> None:
    assert store.load("good") == good
    assert "good" in [info.id for info in store.list()]


def test_bad_ids_get_a_clear_error_and_harm_nothing(
    store: Store, request: pytest.FixtureRequest, reliability_report: ReliabilityReport
) -> None:
    kind = request.node.callspec.params["store"]
    good = _good_state(store)
    seen = []
    for what, bad in REFUSED_IDS.items():
        with pytest.raises(ValueError) as made:
            State(bad, [Message.user("Hello")])
        with pytest.raises(ValueError) as loaded:
            store.load(bad)
        for raised in (made.value, loaded.value):
            assert repr(bad) in str(raised) and "State id" in str(raised)
        assert str(made.value) == str(loaded.value)
        seen.append((f"an id with {what}", str(made.value)))
    long = State(LONG_ID, [Message.user("Hello")])
    if kind == "memory":  # the spec's MemoryStore keeps any id: it has no limit to state
        store.save(long)
        assert store.load(LONG_ID) == long
    else:
        with pytest.raises(ValueError, match=r"is too long for a store") as too_long:
            store.save(long)
        assert LONG_ID[:40] in str(too_long.value)
        with pytest.raises(ValueError, match=r"is too long for a store"):
            store.load(LONG_ID)
        seen.append((f"an id of 1,000 characters ({type(store).__name__})", str(too_long.value)))
    _unharmed(store, good)
    if kind in ("file", "minio"):
        for what, message in seen:
            reliability_report.saw_bad_input(what, message)


def test_ids_with_dots_and_slashes_stay_inside_their_store(
    store: Store, request: pytest.FixtureRequest, reliability_report: ReliabilityReport
) -> None:
    kind = request.node.callspec.params["store"]
    good = _good_state(store)
    for state_id in CONFINED_IDS:
        state = State(state_id, [Message.user(f"I am {state_id}")])
        store.save(state)
        assert store.load(state_id) == state
    assert sorted(info.id for info in store.list()) == sorted([*CONFINED_IDS, "good"])
    if isinstance(store, FileStore):
        outside = [p for p in store.folder.parent.rglob("*") if store.folder not in p.parents]
        assert outside == [store.folder]
        assert all(p.parent == store.folder for p in store.folder.iterdir())
    if isinstance(store, MinioStore):
        keys = [o.object_name for o in store.client.list_objects(store.bucket, recursive=True)]
        assert keys and all(str(k).startswith(store.prefix) for k in keys)
    for state_id in CONFINED_IDS:
        store.delete(state_id)
    _unharmed(store, good)
    assert [info.id for info in store.list()] == ["good"]
    if kind in ("file", "minio"):
        reliability_report.bad_input[f"ids {', '.join(map(repr, CONFINED_IDS))}"] = (
            "saved, listed, loaded and deleted as they are; every file or object stays "
            "inside the store's folder or prefix"
        )


def test_damaged_and_foreign_files_under_a_filestore(
    tmp_path: Path, reliability_report: ReliabilityReport
) -> None:
    store = FileStore(tmp_path / "runs")
    good = _good_state(store)
    for state_id in ("middle", "info-garbage", "info-list", "future"):
        store.save(State(state_id, [Message.user("one"), Message.user("two"), Message.user("3")]))
    history = store.folder / "middle" / "history.jsonl"
    lines = history.read_bytes().split(b"\n")
    history.write_bytes(b"\n".join([lines[0], b'{"seq": 1, "kind": "mess', *lines[2:]]))
    (store.folder / "info-garbage" / "info.json").write_bytes(b"\x00\x17garbage")
    (store.folder / "info-list" / "info.json").write_text("[1, 2]")
    info = json.loads((store.folder / "future" / "info.json").read_text())
    (store.folder / "future" / "info.json").write_text(json.dumps({**info, "v": 99}))
    (store.folder / "notes.txt").write_text("not a State")
    (store.folder / "stray-folder").mkdir()
    (store.folder / "stray-folder" / "something").write_text("foreign")

    expected = {
        "middle": r"State 'middle' .* is damaged: line 2 of .*history\.jsonl is not a JSON entry",
        "info-garbage": r"State 'info-garbage' .* is damaged: .*info\.json is not a JSON object",
        "info-list": r"State 'info-list' .* is damaged: .*info\.json is not a JSON object",
        "future": r"State 'future' was saved in format 99",
    }
    for state_id, message in expected.items():
        with pytest.raises(ValueError, match=message) as raised:
            store.load(state_id)
        reliability_report.saw_bad_input(
            f"FileStore: {_FILE_DAMAGE[state_id]}", str(raised.value), {str(tmp_path): "<tmp>"}
        )
    listed = sorted(info.id for info in store.list())
    assert listed == ["future", "good", "middle"]  # damaged info.json: left out, not fatal
    _unharmed(store, good)
    reliability_report.bad_input["FileStore: foreign files and folders in its folder"] = (
        "ignored by list(); the damaged States are left out of list() and the others listed"
    )


_FILE_DAMAGE = {
    "middle": "a corrupted line in the middle of history.jsonl",
    "info-garbage": "info.json that is not JSON",
    "info-list": "info.json that is JSON but not an object",
    "future": "an unknown format version (99) in info.json",
}


def test_damaged_and_foreign_objects_under_a_miniostore(
    minio: S3Server, minio_bucket: str, reliability_report: ReliabilityReport
) -> None:
    def connect() -> MinioStore:
        return MinioStore.connect(
            minio.endpoint,
            minio_bucket,
            "runs",
            access_key=minio.access_key,
            secret_key=minio.secret_key,
            secure=False,
        )

    writer = connect()
    client = writer.client
    good = _good_state(writer)
    for state_id in ("torn", "info-garbage", "future"):
        writer.save(State(state_id, [Message.user("one"), Message.user("two")]))
    store = connect()  # reads as another process would (the writer keeps what it wrote)

    def keys_of(state_id: str) -> list[str]:
        return [
            str(o.object_name)
            for o in client.list_objects(minio_bucket, f"runs/{state_id}/", recursive=True)
        ]

    def put(key: str, body: bytes) -> None:
        client.put_object(minio_bucket, key, io.BytesIO(body), len(body))

    (segment,) = [k for k in keys_of("torn") if k.endswith(".jsonl")]
    body = client.get_object(minio_bucket, segment).read()
    put(segment, body[:-20])  # the second entry, cut in the middle
    put("runs/info-garbage/info.json", b"\x00garbage")
    # The State's info is in the header line of its newest slot.
    (slot,) = [k for k in keys_of("future") if k.endswith(".jsonl")]
    head, rest = client.get_object(minio_bucket, slot).read().split(b"\n", 1)
    header = json.loads(head)
    header["info"]["v"] = 99
    put(slot, json.dumps(header).encode() + b"\n" + rest)
    put("runs/notes.txt", b"not a State")
    put("runs/stray-folder/something", b"foreign")
    put(f"runs/good/h-{'0' * 8}/garbage", b"foreign inside a State")
    writer.save(State("short", [Message.user("one"), Message.user("two")]))
    (segment,) = [k for k in keys_of("short") if k.endswith(".jsonl")]
    lines = client.get_object(minio_bucket, segment).read().split(b"\n")
    put(segment, b"\n".join(lines[:2]) + b"\n")  # the header and the first entry

    expected = {
        "torn": (
            r"State 'torn' .* is damaged: object .* is not JSON lines",
            "a segment cut in half",
        ),
        "info-garbage": (
            r"runs/info-garbage/info\.json .* is damaged",
            "info.json that is not JSON",
        ),
        "future": (r"State 'future' was saved in format 99", "an unknown format version (99)"),
        "short": (
            r"State 'short' .* is damaged: object .* should hold entries 0..1, but holds 1",
            "a segment that lost its last entry",
        ),
    }
    for state_id, (message, what) in expected.items():
        with pytest.raises(ValueError, match=message) as raised:
            store.load(state_id)
        reliability_report.saw_bad_input(
            f"MinioStore: {what}",
            re.sub(r"/h-[0-9a-f]{16}/", "/h-<incarnation>/", str(raised.value)),
            {minio_bucket: "<bucket>", minio.endpoint: "<minio>"},
        )
    assert sorted(info.id for info in store.list()) == ["future", "good", "short", "torn"]
    _unharmed(store, good)
    reliability_report.bad_input["MinioStore: foreign objects under its prefix"] = (
        "ignored by list() and load(); the damaged States are left out of list()"
    )


def test_the_cli_names_a_bad_id_or_a_damaged_state(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], reliability_report: ReliabilityReport
) -> None:
    from alpineagents.cli import main
    from alpineagents.runner import ExitCode

    store = FileStore(tmp_path / "runs")
    good = _good_state(store)
    store.save(State("damaged", [Message.user("one"), Message.user("two")]))
    (store.folder / "damaged" / "info.json").write_text("[")
    url = ["--store", f"file://{store.folder}"]
    for command, state_id, message in [
        ("show", "nightly\x00report", "State id 'nightly\\x00report'"),
        ("delete", "nightly\udcffreport", "State id 'nightly\\udcffreport'"),
        ("show", "damaged", "State 'damaged' in FileStore"),
        ("delete", "damaged", "State 'damaged' in FileStore"),
    ]:
        assert main([command, state_id, *url]) == ExitCode.NOT_RETRYABLE
        err = capsys.readouterr().err
        assert err.startswith("alpineagents: ") and message in err and "Traceback" not in err
        reliability_report.saw_bad_input(
            f"CLI: `{command}` of {state_id!r}", err.strip(), {str(tmp_path): "<tmp>"}
        )
    assert main(["list", *url]) == 0
    assert "good" in capsys.readouterr().out
    _unharmed(store, good)
