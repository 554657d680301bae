"""MinioStore on real object stores (MinIO, then SeaweedFS): what the layout must survive.

Failures are real: the server is stopped at an exact request (a hook on the client's
HTTP pool sees each request go out), or a request reaches the server and its answer is
dropped on the way back.
"""

from __future__ import annotations

import io
import json
import random
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import pytest
import urllib3
from minio import Minio
from minio.error import S3Error

from alpineagents import FileStore, Message, State
from alpineagents.store import jsonl
from alpineagents.store.s3 import (
    MinioStore,
    MissingBucketError,
    StateFencedError,
    StoreUnavailableError,
)
from alpineagents.testing.conformance import entry, info
from tests.bench.stores import S3Place


@dataclass
class Sent:
    method: str
    url: str
    body: int  # bytes
    thread: str = ""  # the name of the thread that sent it


@dataclass
class Wire:
    """The HTTP pool of one MinioStore's client: records requests, runs hooks before them."""

    pool: urllib3.PoolManager
    sent: list[Sent] = field(default_factory=list)
    before: list[tuple[Callable[[str, str], bool], Callable[[], None]]] = field(
        default_factory=list
    )
    drop_answer: list[Callable[[str, str], bool]] = field(default_factory=list)

    def __post_init__(self) -> None:
        original = self.pool.urlopen

        def urlopen(method: str, url: str, *args: Any, **kw: Any) -> Any:
            for index, (matches, action) in enumerate(self.before):
                if matches(method, url):
                    del self.before[index]
                    action()
                    break
            body = kw.get("body") or b""
            self.sent.append(Sent(method, url, len(body), threading.current_thread().name))
            response = original(method, url, *args, **kw)
            for index, matches in enumerate(self.drop_answer):
                if matches(method, url):
                    del self.drop_answer[index]
                    response.drain_conn()
                    raise urllib3.exceptions.ProtocolError("connection lost before the answer")
            return response

        self.pool.urlopen = urlopen  # type: ignore[method-assign]

    def count(self) -> int:
        return len(self.sent)

    def since(self, mark: int) -> list[Sent]:
        return self.sent[mark:]


def wired_store(place: S3Place, **options: Any) -> tuple[MinioStore, Wire]:
    """A MinioStore whose client's HTTP requests a test can watch and interrupt."""
    pool = MinioStore.http_client(timeout=5.0)
    client = Minio(
        place.server.endpoint,
        access_key=place.server.access_key,
        secret_key=place.server.secret_key,
        secure=False,
        region="us-east-1",
        http_client=pool,
    )
    return MinioStore(client, place.bucket, "runs", **options), Wire(pool)


def is_info_put(method: str, url: str) -> bool:
    return method == "PUT" and url.split("?")[0].endswith("/info.json")


def is_segment_put(method: str, url: str) -> bool:
    return method == "PUT" and url.split("?")[0].endswith(".jsonl")


def is_batch_delete(method: str, url: str) -> bool:
    return method == "POST" and "delete" in url.split("?", 1)[-1]


def new_state(state_id: str = "run", text: str = "Write the nightly report") -> State:
    return State(state_id, messages=[Message.user(text)])


def segment_keys(place: S3Place) -> list[str]:
    return [key for key in place.object_keys() if key.endswith(".jsonl")]


@pytest.fixture(autouse=True)
def conditional_writes(s3: S3Place) -> None:
    """Every test here needs If-Match / If-None-Match on PUT: probe the server for them."""
    client = s3.server.client()
    key = "probe/conditional"
    try:
        client._execute("PUT", s3.bucket, key, body=b"1", headers={"If-None-Match": "*"})
        try:
            client._execute("PUT", s3.bucket, key, body=b"2", headers={"If-None-Match": "*"})
        except Exception as error:
            if getattr(error, "code", None) != "PreconditionFailed":
                raise
        else:
            pytest.xfail(f"{s3.kind} ignores If-None-Match: * on PUT (no atomic create)")
        try:
            client._execute("PUT", s3.bucket, key, body=b"3", headers={"If-Match": '"0000"'})
        except Exception as error:
            if getattr(error, "code", None) != "PreconditionFailed":
                raise
        else:
            pytest.xfail(f"{s3.kind} ignores If-Match on PUT (no fencing)")
    finally:
        client.remove_object(s3.bucket, key)


# ------------------------------------------------------------------ fencing
def test_a_claim_fences_the_old_writer_and_its_save_stays_invisible(s3: S3Place) -> None:
    old = s3.store()
    state = new_state()
    old.save(state)
    state.send("first step")
    old.save(state)

    operator = s3.store()
    epoch = operator.claim("run")
    assert epoch == 2

    # The replacement loads what was saved, and saves on (claiming on its first write).
    replacement = s3.store()
    resumed = replacement.load("run")
    assert resumed == state
    resumed.send("replacement's step")
    replacement.save(resumed)

    # The old pod is still running: its next save fails, and what it wrote is not seen.
    state.send("old pod's step")
    with pytest.raises(StateFencedError, match="another writer"):
        old.save(state)
    with pytest.raises(StateFencedError):
        old.save(state)  # and it stays fenced

    loaded = s3.store().load("run")
    assert loaded == resumed
    assert [m.text for m in loaded.messages][-1] == "replacement's step"
    assert "old pod's step" not in [m.text for m in loaded.messages]


def race(stores: list[MinioStore], states: list[State]) -> list[BaseException | None]:
    """Save each State through its store, all at once (released together by a barrier)."""
    start = threading.Barrier(len(stores))
    outcome: list[BaseException | None] = [None] * len(stores)

    def save(number: int) -> None:
        start.wait()
        try:
            stores[number].save(states[number])
        except BaseException as error:
            outcome[number] = error

    threads = [threading.Thread(target=save, args=(n,)) for n in range(len(stores))]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return outcome


def test_two_writers_racing_one_wins_the_other_is_fenced(s3: S3Place) -> None:
    s3.store().save(new_state())
    for round_ in range(10):
        racers = [s3.store(), s3.store()]
        states = [racer.load("run") for racer in racers]
        for number, state in enumerate(states):
            state.send(f"round {round_} by {number}")
        outcome = race(racers, states)
        failed = [n for n in (0, 1) if outcome[n] is not None]
        assert len(failed) == 1, outcome
        assert isinstance(outcome[failed[0]], StateFencedError)
        winner = 1 - failed[0]
        assert s3.store().load("run") == states[winner]


def test_loads_while_a_writer_saves_and_merges_see_whole_prefixes(s3: S3Place) -> None:
    writer = s3.store(merge_after=3)
    state = new_state()
    writer.save(state)
    texts = ["Write the nightly report"]
    done = threading.Event()
    seen: list[int] = []
    problems: list[BaseException] = []

    def read_repeatedly() -> None:
        reader = s3.store()
        try:
            while not done.is_set():
                loaded = reader.load("run")
                assert [m.text for m in loaded.messages] == texts[: len(loaded.messages)]
                seen.append(len(loaded.history))
        except BaseException as error:
            problems.append(error)

    thread = threading.Thread(target=read_repeatedly)
    thread.start()
    try:
        for step in range(60):
            texts.append(f"step {step}")
            state.send(texts[-1])
            writer.save(state)
    finally:
        done.set()
        thread.join()
    assert not problems, problems
    assert seen == sorted(seen)  # never goes back
    assert s3.store().load("run") == state


def test_a_claim_after_load_refuses_a_state_written_meanwhile(s3: S3Place) -> None:
    writer = s3.store()
    state = new_state()
    writer.save(state)
    late = s3.store()
    stale = late.load("run")
    state.send("written after the other store read it")
    writer.save(state)
    stale.send("based on an old copy")
    with pytest.raises(StateFencedError, match="since this store read it"):
        late.save(stale)
    assert s3.store().load("run") == state


def test_a_fenced_writer_is_refused_even_after_the_new_owner_merged(s3: S3Place) -> None:
    old = s3.store(merge_after=4)
    state = new_state()
    old.save(state)
    new = s3.store(merge_after=4)
    resumed = new.load("run")
    for step in range(12):
        resumed.send(f"step {step}")
        new.save(resumed)
    new.wait_for_merges()
    state.send("zombie")
    with pytest.raises(StateFencedError):
        old.save(state)
    assert s3.store().load("run") == resumed
    # Merged: the two fence posts (each epoch's first slot), a few merged objects, and
    # fewer than merge_after slots since the last merge.
    assert len(segment_keys(s3)) <= 2 + 2 + 4


def test_a_zombie_whose_lost_write_was_merged_away_is_still_refused(s3: S3Place) -> None:
    """The one slot a merge may delete that a fenced writer targets: its own, after it
    lost the answer. Its create then lands again, and the listing after it tells."""
    old, wire = wired_store(s3, retry_budget=1.0)
    state = new_state()
    old.save(state)
    state.send("landed, but the answer was lost in an outage")
    wire.before += [(is_segment_put, lambda: None), (is_segment_put, s3.server.stop)]
    wire.drop_answer.append(is_segment_put)
    with pytest.raises(StoreUnavailableError):
        old.save(state)
    s3.server.start()

    new = s3.store(merge_after=3)
    resumed = new.load("run")
    assert resumed == state  # what landed is saved, answer or not
    for step in range(9):
        resumed.send(f"step {step}")
        new.save(resumed)
    new.wait_for_merges()
    slot_1 = [key for key in segment_keys(s3) if key.endswith("/s-000000000001.jsonl")]
    assert not slot_1  # the zombie's slot is merged away: its key is free again

    state.send("zombie")
    with pytest.raises(StateFencedError):
        old.save(state)
    assert s3.store().load("run") == resumed


# ------------------------------------------------------------------ interrupted saves
def test_a_save_whose_answer_an_outage_took_is_recognised_and_continued(
    s3: S3Place,
) -> None:
    store, wire = wired_store(s3, retry_budget=1.0)
    state = new_state()
    store.save(state)
    state.send("landed, answer lost")
    # The slot lands, its answer is lost, and the server is gone before the retry.
    wire.before += [(is_segment_put, lambda: None), (is_segment_put, s3.server.stop)]
    wire.drop_answer.append(is_segment_put)
    with pytest.raises(StoreUnavailableError, match="budget of 1s"):
        store.save(state)
    s3.server.start()

    loaded = s3.store().load("run")
    assert [m.text for m in loaded.messages] == ["Write the nightly report", "landed, answer lost"]

    state.send("after the outage")
    store.save(state)  # sends both again: the first is found in its own slot, not doubled
    loaded = s3.store().load("run")
    assert loaded == state
    assert [e.seq for e in loaded.history] == list(range(len(state.history)))


def test_a_lost_answer_to_a_conditional_put_is_recognised_as_our_own(s3: S3Place) -> None:
    store, wire = wired_store(s3)
    state = new_state()
    wire.drop_answer.append(is_info_put)  # the create lands; its answer never comes back
    store.save(state)  # retried: the 412 it gets is its own create
    state.send("next")
    wire.drop_answer.append(is_segment_put)
    store.save(state)  # the same for the create of a slot
    state.send("after")
    store.save(state)
    assert s3.store().load("run") == state


def test_a_create_stopped_before_its_info_leaves_nothing_visible(s3: S3Place) -> None:
    store, wire = wired_store(s3, retry_budget=1.0)
    wire.before.append((is_info_put, s3.server.stop))
    with pytest.raises(StoreUnavailableError):
        store.save(new_state())
    s3.server.start()
    fresh = s3.store()
    assert fresh.read("run") is None
    assert fresh.list() == []
    assert len(segment_keys(s3)) == 1  # the orphan

    again = new_state(text="second try")
    fresh.save(again)
    assert fresh.load("run") == again
    assert len(segment_keys(s3)) == 1  # the orphan was removed by the successful create


def test_create_of_an_existing_id_writes_nothing(s3: S3Place) -> None:
    store = s3.store()
    store.save(new_state())
    before = s3.object_keys()
    other, wire = wired_store(s3)
    with pytest.raises(ValueError, match=r"already exists.*load"):
        other.save(new_state(text="another run, same id"))
    assert s3.object_keys() == before
    assert not [s for s in wire.sent if s.method == "PUT"]


def test_a_create_racing_another_create_loses_cleanly(s3: S3Place) -> None:
    first, second = s3.store(), s3.store()
    loser, wire = wired_store(s3)
    # The loser has listed (no State yet) and written its segment when the winner creates.
    winner_state = new_state(text="winner")
    wire.before.append((is_info_put, lambda: first.save(winner_state)))
    with pytest.raises(ValueError, match="already exists"):
        loser.save(new_state(text="loser"))
    assert second.load("run") == winner_state
    assert len(segment_keys(s3)) == 1  # the loser took its segment back


def test_an_unknown_id_is_refused_and_nothing_is_written(s3: S3Place) -> None:
    store = s3.store()
    with pytest.raises(LookupError):
        store.write("ghost", [entry(0)], info(1))
    assert s3.object_keys() == []


# ------------------------------------------------------------------ merging
def test_a_thousand_saves_load_in_a_few_requests(s3: S3Place) -> None:
    writer, write_wire = wired_store(s3)
    state = new_state()
    writer.save(state)
    per_save: list[list[Sent]] = []
    for step in range(999):
        state.send(f"step {step}: " + "x" * 250)
        mark = write_wire.count()
        writer.save(state)
        per_save.append(write_wire.since(mark))

    # Every save is one request: the create of one slot with just the new entry and
    # the State's info. Merges run on a thread of their own, and the save does not wait.
    here = threading.current_thread().name
    own = [[s for s in sent if s.thread == here] for sent in per_save]
    assert all(len(sent) == 1 for sent in own)
    for (sent,) in own:
        assert is_segment_put(sent.method, sent.url)
        assert sent.body < 1500  # one ~300-byte entry and the info, whatever the length

    writer.wait_for_merges()
    reader, read_wire = wired_store(s3)
    loaded = reader.load("run")
    assert loaded == state
    assert len(loaded.history) == 1000
    # Bucket check, info, one listing, and a few merged objects and recent slots.
    assert read_wire.count() <= 3 + 24
    assert len(segment_keys(s3)) <= 24


def test_a_merge_stopped_after_its_merged_segment_loses_nothing(s3: S3Place) -> None:
    store, wire = wired_store(s3, merge_after=6, retry_budget=1.0)
    state = new_state()
    store.save(state)
    for step in range(4):
        state.send(f"step {step}")
        store.save(state)
    before = segment_keys(s3)
    assert len(before) == 5
    # The next save starts a merge: its merged object lands, the server goes before the
    # delete.
    wire.before.append((is_batch_delete, s3.server.stop))
    state.send("the save that merges")
    store.save(state)
    store.wait_for_merges()  # the save itself succeeded; the merge failed quietly
    s3.server.start()

    after = segment_keys(s3)
    assert set(before) < set(after)  # old slots still there, next to the merged one
    assert any("/m-" in key for key in after)
    loaded = s3.store().load("run")
    assert loaded == state
    assert [e.seq for e in loaded.history] == list(range(len(state.history)))

    for step in range(6):  # merge_after saves later, a merge runs again and tidies up
        state.send(f"later {step}")
        store.save(state)
    store.wait_for_merges()
    assert len(segment_keys(s3)) < len(after)
    assert s3.store().load("run") == state


def test_a_merge_by_a_fenced_writer_does_not_hide_the_new_owners_entries(s3: S3Place) -> None:
    old = s3.store(merge_after=3)
    state = new_state()
    old.save(state)
    for step in range(2):
        state.send(f"old {step}")
        old.save(state)
    new = s3.store(merge_after=3)
    resumed = new.load("run")
    resumed.send("new owner")
    new.save(resumed)
    state.send("zombie")
    with pytest.raises(StateFencedError):
        old.save(state)  # its segment went out, past what is committed
    for step in range(5):
        resumed.send(f"new {step}")
        new.save(resumed)
    assert s3.store().load("run") == resumed


# ------------------------------------------------------------------ layout 1
def put_layout_1(s3: S3Place, state: State) -> str:
    """Save ``state`` as MinioStore's layout 1 did (info.json rewritten at every save);
    return the ETag of its info.json."""
    client = s3.server.client()
    record = state.to_record()
    lines = jsonl.encode(record.entries)
    last = len(record.entries) - 1
    folder = f"runs/{state.id}/"
    segment = f"{folder}h-abc/000000000000-{last:012d}-0000000001.jsonl"
    client.put_object(s3.bucket, segment, io.BytesIO(lines), len(lines))
    doc = {
        "store": 1,
        "incarnation": "abc",
        "epoch": 1,
        "writer": "w",
        "committed": len(record.entries),
        "segments": 1,
        "info": record.info,
        "nonce": "n",
    }
    body = json.dumps(doc).encode()
    client.put_object(s3.bucket, folder + "info.json", io.BytesIO(body), len(body))
    return str(client.stat_object(s3.bucket, folder + "info.json").etag)


def test_a_layout_1_state_loads_and_its_first_write_converts_it(s3: S3Place) -> None:
    state = new_state()
    state.send("saved by an earlier version")
    etag = put_layout_1(s3, state)
    store = s3.store()
    assert [saved.id for saved in store.list()] == ["run"]
    loaded = store.load("run")
    assert loaded == state
    loaded.send("after the upgrade")
    store.save(loaded)
    loaded.send("and one more")
    store.save(loaded)
    assert s3.store().load("run") == loaded
    assert not [key for key in s3.object_keys() if "/h-abc/" in key]  # layout 1 is gone
    # A layout-1 writer still running is fenced: its If-Match on info.json fails.
    with pytest.raises(S3Error, match="PreconditionFailed"):
        s3.server.client()._execute(
            "PUT", s3.bucket, "runs/run/info.json", body=b"{}", headers={"If-Match": etag}
        )

    other = new_state("other")
    put_layout_1(s3, other)
    assert s3.store().claim("other") == 2  # a claim converts it too
    assert s3.store().load("other") == other


# ------------------------------------------------------------------ outages
def test_an_outage_fails_a_save_within_the_budget_and_loses_nothing(s3: S3Place) -> None:
    store = s3.store(retry_budget=2.0, timeout=1.0)
    state = new_state()
    store.save(state)
    s3.server.stop()
    state.send("while the store is down")
    with pytest.raises(StoreUnavailableError, match="budget of 2s") as failure:
        store.save(state)
    assert "attempts" in str(failure.value)
    with pytest.raises(StoreUnavailableError):
        store.load("run")
    s3.server.start()
    state.send("after it came back")
    store.save(state)
    loaded = s3.store().load("run")
    assert loaded == state
    assert [m.text for m in loaded.messages][-2:] == [
        "while the store is down",
        "after it came back",
    ]


# ------------------------------------------------------------------ reading, listing
def test_list_shows_each_states_newest_save_in_three_requests(s3: S3Place) -> None:
    writer = s3.store()
    for name in ["a", "b", "c"]:
        state = new_state(name)
        writer.save(state)
        for step in range(3 if name != "b" else 5):
            state.send(f"{name} {step}")
            writer.save(state)
    reader, wire = wired_store(s3)
    listed = {saved.id: saved for saved in reader.list()}
    assert sorted(listed) == ["a", "b", "c"]
    assert {saved.entries for saved in listed.values()} == {4, 6}
    assert listed["b"].entries == 6
    # The listing of States, then each State's info.json, listing, and newest header.
    assert [s.method for s in wire.sent].count("GET") <= 1 + 3 * 3


def test_delete_removes_every_object_of_the_id_only(s3: S3Place) -> None:
    store = s3.store()
    for name in ["a", "ab", "a/b"]:
        store.save(new_state(name))
    store.delete("a")
    assert sorted(saved.id for saved in store.list()) == ["a/b", "ab"]
    # What stays is one empty slot that refuses a writer still saving "a".
    (fence,) = [key for key in s3.object_keys() if key.startswith("runs/a/")]
    body = s3.server.client().get_object(s3.bucket, fence).read()
    assert body.count(b"\n") == 1 and b'"deleted"' in body and b"nightly" not in body
    assert [key for key in s3.object_keys() if key.startswith("runs/ab/")]
    store.save(new_state("a", text="again"))  # a new State with the id removes it
    assert fence not in s3.object_keys()


def test_a_writer_of_a_deleted_state_cannot_bring_it_back(s3: S3Place) -> None:
    writer = s3.store()
    state = new_state()
    writer.save(state)
    s3.store().delete("run")
    state.send("after the delete")
    with pytest.raises(LookupError):
        writer.save(state)
    assert s3.store().read("run") is None
    recreated = new_state(text="a new run with the old id")
    s3.store().save(recreated)
    assert s3.store().load("run") == recreated


# ------------------------------------------------------------------ the store object
def test_same_as_is_endpoint_bucket_and_prefix(s3: S3Place, tmp_path: Any) -> None:
    assert s3.store().same_as(s3.store())
    assert s3.store("runs").same_as(s3.store("runs/"))
    assert not s3.store("runs").same_as(s3.store("other"))
    assert not s3.store().same_as(FileStore(tmp_path))


def test_repr_and_errors_never_show_the_secret(s3: S3Place) -> None:
    store = s3.store(retry_budget=0.5)
    assert s3.server.secret_key not in repr(store)
    assert s3.server.access_key not in repr(store)
    s3.server.stop()
    with pytest.raises(StoreUnavailableError) as failure:
        store.save(new_state())
    assert s3.server.secret_key not in str(failure.value)


def test_a_missing_bucket_is_created_or_named(s3: S3Place) -> None:
    place = S3Place(s3.server, s3.bucket + "-missing")
    with pytest.raises(MissingBucketError, match=f"{place.bucket}.*{s3.server.endpoint}"):
        place.store(create_bucket=False).save(new_state())
    try:
        store = place.store()
        store.save(new_state())
        assert place.store().load("run") == store.load("run")
    finally:
        s3.server.remove_bucket(place.bucket)


def test_a_bad_prefix_is_refused(s3: S3Place) -> None:
    for prefix in ["a/../b", "..", "./x", "a//b"]:
        with pytest.raises(ValueError, match="prefix"):
            s3.store(prefix)


def test_owners_taking_turns_with_zombies_and_lost_answers_keep_one_history(
    s3: S3Place,
) -> None:
    """Random but reproducible: stores take the State over in turn; the one replaced
    keeps trying to save; answers to slot PUTs get lost on the way back; merges run often."""
    rng = random.Random(20260301)
    stores = [wired_store(s3, merge_after=3) for _ in range(3)]
    first, _ = stores[0]
    truth = new_state()
    first.save(truth)
    owner, owner_state = 0, truth
    for round_ in range(8):
        successor = rng.choice([n for n in range(3) if n != owner])
        store, wire = stores[successor]
        if rng.random() < 0.5:
            s3.store().claim("run")  # the operator takes over before starting the successor
        resumed = store.load("run")
        assert resumed == truth
        for step in range(rng.randint(1, 6)):
            resumed.send(f"round {round_} step {step} by {successor}")
            if rng.random() < 0.3:
                wire.drop_answer.append(is_segment_put)
            store.save(resumed)
            truth = resumed
        # The replaced owner is still alive and tries to save once more.
        old_store, _ = stores[owner]
        owner_state.send(f"zombie write in round {round_}")
        with pytest.raises(StateFencedError):
            old_store.save(owner_state)
        assert s3.store().load("run") == truth
        owner, owner_state = successor, resumed
