"""Encryption at rest (alpineagents.encryption): what the stores hold, keys, rotation, tampering.

The conformance and contract suites run through the wrapper too (the ``+encrypted`` kinds
of the ``store`` fixture); these tests look at the bytes the stores keep.
"""

from __future__ import annotations

import asyncio
import base64
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from alpineagents import Agent, FileStore, Message, State, Store, tool
from alpineagents.store import Record
from alpineagents.store.encrypted import DecryptionError, EncryptedStore, Keyring
from alpineagents.store.url import open_store
from alpineagents.testing import MemoryStore, ModelServer, reply, tool_use
from tests.bench.stores import TEST_KEYRING_TEXT, AsyncMemory, S3Place

MODEL = "claude-sonnet-5"

# Words that appear only in the conversation: the user's message, a tool's input and
# result, the model's text, a subagent's task and answer, and the final answer.
SECRET_WORDS = (
    "Quetzalcoatl-payroll",
    "cobalt-ledger-7731",
    "heron-tool-result",
    "marigold-thinking",
    "subagent-saffron",
    "answer-obsidian",
)


def keyring(*ids: str) -> Keyring:
    return Keyring([(key_id, bytes([n]) * 32) for n, key_id in enumerate(ids, start=1)])


@tool
def ledger(account: str) -> str:
    """Reads a ledger account."""
    return f"{account}: heron-tool-result"


def run_a_conversation(store: Store, model_server: ModelServer) -> State:
    """A run with a tool call, a subagent and an answer, each carrying SECRET_WORDS."""
    researcher = Agent(model=MODEL, store=store, max_tokens=1024)
    lead = Agent(
        model=MODEL,
        store=store,
        tools=[ledger, researcher.as_tool("research", "Researches a question")],
        max_tokens=1024,
    )
    model_server.add(
        reply("marigold-thinking", tool_use("ledger", {"account": "cobalt-ledger-7731"})),
        reply(tool_use("research", {"task": "Find subagent-saffron"}, id="toolu_r1")),
        reply("subagent-saffron found"),
        reply("Done: answer-obsidian"),
    )
    state = State("payroll", messages=[Message.user("Audit Quetzalcoatl-payroll")])
    assert lead.run(state) == "Done: answer-obsidian"
    return state


def raw_file_bytes(folder: Path) -> bytes:
    return b"\n".join(p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file())


def raw_object_bytes(place: S3Place) -> bytes:
    client = place.server.client()
    bodies = []
    for key in place.object_keys():
        response = client.get_object(place.bucket, key)
        try:
            bodies.append(key.encode() + b"\n" + response.read())
        finally:
            response.close()
            response.release_conn()
    return b"\n".join(bodies)


def assert_no_plaintext(raw: bytes) -> None:
    found = [word for word in SECRET_WORDS if word.encode() in raw]
    assert not found, f"plaintext of the conversation in the store: {found}"


# Every test's Agent (and child process) reaches the scripted model.
pytestmark = pytest.mark.usefixtures("model_endpoint")


# ------------------------------------------------------------------ what the store holds
def test_the_files_of_an_encrypted_filestore_hold_no_plaintext(
    tmp_path: Path, model_server: ModelServer
) -> None:
    plain_folder, sealed_folder = tmp_path / "plain", tmp_path / "sealed"
    # The same run without encryption: the words are there to be found.
    run_a_conversation(FileStore(plain_folder), model_server)
    assert all(word.encode() in raw_file_bytes(plain_folder) for word in SECRET_WORDS)

    store = EncryptedStore(FileStore(sealed_folder), keyring("k1"))
    live = run_a_conversation(store, model_server)
    raw = raw_file_bytes(sealed_folder)
    assert_no_plaintext(raw)
    # The list fields stay readable without the key; the history reads back whole with it.
    record = FileStore(sealed_folder).read("payroll")  # what the store holds, unopened
    assert record is not None
    info = record.info
    assert info["stopped"] == "answered" and info["entries"] == len(live.history)
    assert set(info) == {"v", "updated_at", "stopped", "parent_id", "entries", "turns", "usage"} | {
        "sealed"
    }
    assert store.load("payroll") == live
    assert store.load("payroll").answer == "Done: answer-obsidian"
    listed = {saved.id: saved for saved in store.list()}
    assert listed["payroll"].first_message == "Audit Quetzalcoatl-payroll"
    assert listed["payroll.toolu_r1"].parent_id == "payroll"


def test_the_objects_of_an_encrypted_s3_store_hold_no_plaintext(
    s3: S3Place, model_server: ModelServer
) -> None:
    inner = s3.store(merge_after=2)
    store = EncryptedStore(inner, keyring("k1"))
    live = run_a_conversation(store, model_server)
    live.send("one more: Quetzalcoatl-payroll")
    store.save(live)  # more slots, and merges of them, all sealed
    inner.wait_for_merges()  # merges run in the background: read what they wrote
    raw = raw_object_bytes(s3)
    assert any("/m-" in key for key in s3.object_keys())
    assert b"info.json" in raw and b".jsonl" in raw
    assert_no_plaintext(raw)
    loaded = store.load("payroll")
    assert loaded == live
    assert loaded.messages[-1].text == "one more: Quetzalcoatl-payroll"


def test_a_store_without_the_key_refuses_an_encrypted_state_and_says_why(
    tmp_path: Path, model_server: ModelServer
) -> None:
    run_a_conversation(EncryptedStore(FileStore(tmp_path), keyring("k1")), model_server)
    with pytest.raises(ValueError, match=r"encrypted.*encrypted=true"):
        FileStore(tmp_path).load("payroll")
    # list still shows how each run stands, from the readable fields.
    listed = {saved.id: saved for saved in FileStore(tmp_path).list()}
    assert listed["payroll"].entries > 0 and listed["payroll"].first_message is None


# ------------------------------------------------------------------ keys
def test_keys_rotate_old_ones_read_the_newest_writes(tmp_path: Path) -> None:
    state = State("rotating", messages=[Message.user("written with k1")])
    EncryptedStore(FileStore(tmp_path), keyring("k1")).save(state)

    rotated = EncryptedStore(FileStore(tmp_path), keyring("k1", "k2"))
    loaded = rotated.load("rotating")
    loaded.send("written with k2")
    rotated.save(loaded)

    held = FileStore(tmp_path).read("rotating")  # what the store holds, unopened
    assert held is not None
    assert [entry["sealed"]["key"] for entry in held.entries] == ["k1", "k2"]
    assert held.info["sealed"]["key"] == "k2"
    assert [m.text for m in rotated.load("rotating").messages] == [
        "written with k1",
        "written with k2",
    ]
    # Dropping k1 too early: the error names the missing key and how to fix it.
    with pytest.raises(DecryptionError, match=r"'k1'.*not in the keyring.*ALPINEAGENTS"):
        EncryptedStore(FileStore(tmp_path), keyring("k2")).load("rotating")


def test_a_different_key_under_the_same_id_does_not_decrypt(tmp_path: Path) -> None:
    EncryptedStore(FileStore(tmp_path), keyring("k1")).save(State("s", [Message.user("hi")]))
    impostor = Keyring([("k1", b"\xff" * 32)])
    with pytest.raises(DecryptionError, match="does not decrypt"):
        EncryptedStore(FileStore(tmp_path), impostor).load("s")


def test_changed_or_moved_ciphertext_is_refused() -> None:
    inner = MemoryStore()
    store = EncryptedStore(inner, keyring("k1"))
    store.save(State("victim", messages=[Message.user("first"), Message.user("second")]))
    store.save(State("other", messages=[Message.user("from another State")]))
    first, second = inner.records["victim"].entries
    info = inner.records["victim"].info

    def holds(*entries: dict[str, Any]) -> None:
        inner.records["victim"] = Record(list(entries), info)

    # Two entries swapped: each is bound to its seq.
    holds({**first, "sealed": second["sealed"]}, {**second, "sealed": first["sealed"]})
    with pytest.raises(DecryptionError, match="entry 0"):
        store.load("victim")

    # An entry of another State: bound to its State id.
    holds(inner.records["other"].entries[0], second)
    with pytest.raises(DecryptionError, match="victim"):
        store.load("victim")

    # One bit flipped in the ciphertext.
    data = bytearray(base64.b64decode(first["sealed"]["data"]))
    data[0] ^= 1
    holds({**first, "sealed": {**first["sealed"], "data": base64.b64encode(data).decode()}}, second)
    with pytest.raises(DecryptionError, match="does not decrypt"):
        store.load("victim")
    holds(first, second)
    assert [m.text for m in store.load("victim").messages] == ["first", "second"]


def test_changed_readable_info_fields_are_refused(tmp_path: Path) -> None:
    # stopped, parent_id and the counts stay readable (the operator and list read them)
    # but are bound to the sealed part: changed, the info does not open.
    inner = MemoryStore()
    store = EncryptedStore(inner, keyring("k1"))
    store.save(State("run", messages=[Message.user("hi")]))
    record = inner.records["run"]
    for field, value in (("stopped", "answered"), ("parent_id", "other"), ("turns", 99)):
        inner.records["run"] = Record(record.entries, {**record.info, field: value})
        with pytest.raises(DecryptionError, match="info"):
            store.load("run")
    inner.records["run"] = record
    assert store.load("run").first_message == "hi"


def test_plaintext_entries_are_refused_unless_asked_for(tmp_path: Path) -> None:
    FileStore(tmp_path).save(State("before", messages=[Message.user("saved in the clear")]))
    with pytest.raises(DecryptionError, match=r"not encrypted.*read_plaintext"):
        EncryptedStore(FileStore(tmp_path), keyring("k1")).load("before")
    store = EncryptedStore(FileStore(tmp_path), keyring("k1"), read_plaintext=True)
    state = store.load("before")
    state.send("saved sealed")
    store.save(state)
    held = FileStore(tmp_path).read("before")
    assert held is not None
    assert "saved in the clear" in json.dumps(held.entries[0]) and "sealed" in held.entries[1]
    assert [m.text for m in store.load("before").messages] == ["saved in the clear", "saved sealed"]


def test_keyring_text_and_its_mistakes() -> None:
    ring = Keyring.from_text(TEST_KEYRING_TEXT)
    assert ring.ids == ["old", "new"] and ring.current == "new"
    assert "AAEC" not in repr(ring)  # the repr names ids, never keys
    url_safe = "k:" + base64.urlsafe_b64encode(b"\xfb" * 32).decode()
    assert Keyring.from_text(url_safe).ids == ["k"]
    for text, problem in [
        ("", "holds no keys"),
        ("k1", "not ID:BASE64"),
        ("k1:not*base64", "not base64"),
        ("k1:" + base64.b64encode(b"short").decode(), "5 bytes; it must have 32"),
        ("bad/id:" + base64.b64encode(bytes(32)).decode(), "is not 1-64 letters"),
        (TEST_KEYRING_TEXT + ",old:" + base64.b64encode(bytes(32)).decode(), "given twice"),
    ]:
        with pytest.raises(ValueError, match=problem):
            Keyring.from_text(text)


def test_new_key_prints_an_item_the_keyring_reads() -> None:
    result = subprocess.run(
        [sys.executable, "-m", "alpineagents.store.encrypted", "new-key", "2026-03"],
        capture_output=True,
        text=True,
        check=True,
    )
    item = result.stdout.strip()
    assert Keyring.from_text(item).current == "2026-03"
    assert item != Keyring.new_item("2026-03")  # random each time


# ------------------------------------------------------------------ turning it on
def test_open_store_wraps_with_encrypted_true(tmp_path: Path, s3: S3Place) -> None:
    env = {"ALPINEAGENTS_ENCRYPTION_KEYS": TEST_KEYRING_TEXT}
    file_store = open_store(f"file://{tmp_path}?encrypted=true", env)
    assert isinstance(file_store, EncryptedStore) and isinstance(file_store.inner, FileStore)
    assert file_store.keyring.current == "new"
    assert not isinstance(open_store(f"file://{tmp_path}?encrypted=false", env), EncryptedStore)

    keys_file = tmp_path / "keys"
    keys_file.write_text(TEST_KEYRING_TEXT + "\n")
    s3_env = {
        "ALPINEAGENTS_ENCRYPTION_KEYS_FILE": str(keys_file),
        "AWS_ACCESS_KEY_ID": s3.server.access_key,
        "AWS_SECRET_ACCESS_KEY": s3.server.secret_key,
    }
    url = f"s3://{s3.bucket}/runs?endpoint={s3.server.endpoint}&secure=false&encrypted=true"
    s3_store = open_store(url, s3_env)
    assert isinstance(s3_store, EncryptedStore)
    s3_store.save(State("via-url", messages=[Message.user("cobalt-ledger-7731")]))
    assert_no_plaintext(raw_object_bytes(s3))
    assert open_store(url, s3_env).load("via-url").messages[0].text == "cobalt-ledger-7731"
    assert s3_store.supports("claim") and s3_store.claim("via-url") == 2  # MinioStore's fencing
    assert not open_store(f"file://{tmp_path}?encrypted=true", env).supports("claim")

    with pytest.raises(ValueError, match=r"encrypted=true.*ALPINEAGENTS_ENCRYPTION_KEYS"):
        open_store(f"file://{tmp_path}?encrypted=true", {})
    with pytest.raises(ValueError, match="encrypted='maybe' is not true or false"):
        open_store(f"file://{tmp_path}?encrypted=maybe", env)


def test_an_async_only_store_can_be_wrapped(model_server: ModelServer) -> None:
    inner = AsyncMemory()
    store = EncryptedStore(inner, keyring("k1"))
    assert store.is_async_only
    model_server.add(reply("answer-obsidian"))
    agent = Agent(model=MODEL, store=store, max_tokens=1024)
    state = State("a", messages=[Message.user("Quetzalcoatl-payroll")])
    assert asyncio.run(agent.arun(state)) == "answer-obsidian"
    assert_no_plaintext(json.dumps([inner.records["a"].entries, inner.records["a"].info]).encode())
    assert asyncio.run(store.aload("a")).answer == "answer-obsidian"
    with pytest.raises(TypeError, match="async-only"):
        store.load("a")
