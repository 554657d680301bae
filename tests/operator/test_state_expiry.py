"""``onDelete: Expire`` against a real MinIO: the operator puts the bucket's own lifecycle
rule on its store's prefix (``store.retention.days``), keeping the bucket's other rules,
and a run deleted with ``Expire`` has its State's objects tagged for that rule and nothing
else. MinIO's scanner, which removes the objects days later, is not waited for: the rule
as MinIO holds it (``get_bucket_lifecycle``) and the tags are what the operator does.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from minio.commonconfig import ENABLED, Filter
from minio.lifecycleconfig import Expiration, LifecycleConfig, Rule

from alpineagents import FileStore, Message, State, Store
from alpineagents.pod_contract import state_id_for
from alpineagents.store.encrypted import EncryptedStore, Keyring
from alpineagents.store.s3 import MinioStore
from alpineagents_operator.credentials.state_expiry import (
    EXPIRE_TAG,
    ensure_expiry_rule,
    leave_to_rule,
    rule_id,
)
from tests.bench.control_plane import ControlPlane
from tests.bench.minio_server import S3Server
from tests.bench.operator_process import (
    Event,
    EventLog,
    agentrun,
    operator_in_namespace,
    pod_added,
)

THEIRS = Rule(
    ENABLED, rule_filter=Filter(prefix="scratch/"), rule_id="theirs", expiration=Expiration(days=1)
)


def store_in(minio: S3Server, bucket: str, prefix: str = "runs") -> MinioStore:
    return MinioStore(minio.client(), bucket, prefix, retry_budget=10)


def rules(minio: S3Server, bucket: str) -> dict[str, tuple[Any, ...]]:
    """The bucket's lifecycle rules as MinIO holds them: id → (status, prefix, tags, days)."""
    config = minio.client().get_bucket_lifecycle(bucket)
    found = {}
    for rule in config.rules if config else []:
        where, both = rule.rule_filter, rule.rule_filter.and_operator
        prefix = both.prefix if both else where.prefix
        tags = dict(both.tags or {}) if both else {}
        found[rule.rule_id] = (rule.status, prefix, tags, rule.expiration.days)
    return found


def tags_by_object(minio: S3Server, bucket: str) -> dict[str, dict[str, str]]:
    client = minio.client()
    return {
        str(item.object_name): dict(client.get_object_tags(bucket, item.object_name) or {})
        for item in client.list_objects(bucket, recursive=True)
    }


def saved(store: Store, state_id: str, saves: int) -> State:
    """A State saved ``saves`` times (an object per save, as a run's pod leaves it)."""
    state = State(state_id, [Message.user("first")])
    store.save(state)
    for n in range(saves - 1):
        state.send(Message.user(f"more {n}"))
        store.save(state)
    return state


def test_the_rule_goes_on_the_stores_prefix_and_the_buckets_other_rules_stay(
    minio: S3Server, minio_bucket: str
) -> None:
    minio.client().set_bucket_lifecycle(minio_bucket, LifecycleConfig([THEIRS]))

    assert ensure_expiry_rule(store_in(minio, minio_bucket, "team-a/runs"), 7)
    ours = rule_id("team-a/runs/")
    assert rules(minio, minio_bucket) == {
        "theirs": (ENABLED, "scratch/", {}, 1),
        ours: (ENABLED, "team-a/runs/", dict([EXPIRE_TAG]), 7),
    }

    # Another release's prefix in the same bucket gets a rule of its own; new days replace.
    assert ensure_expiry_rule(store_in(minio, minio_bucket, "team-b"), 3)
    assert ensure_expiry_rule(store_in(minio, minio_bucket, "team-a/runs"), 30)
    assert rules(minio, minio_bucket) == {
        "theirs": (ENABLED, "scratch/", {}, 1),
        ours: (ENABLED, "team-a/runs/", dict([EXPIRE_TAG]), 30),
        rule_id("team-b/"): (ENABLED, "team-b/", dict([EXPIRE_TAG]), 3),
    }


def test_an_expiring_state_is_tagged_whole_and_no_other_is(
    minio: S3Server, minio_bucket: str
) -> None:
    store = store_in(minio, minio_bucket)
    original = saved(store, "ns.expiring", 5)
    saved(store, "ns.kept", 3)
    store.wait_for_merges()

    assert leave_to_rule(store, "ns.expiring", None).startswith("kept")  # no rule: untouched
    assert not any(tags_by_object(minio, minio_bucket).values())

    what = leave_to_rule(store, "ns.expiring", 7)
    assert what.startswith("left to the bucket's rule")
    tags = tags_by_object(minio, minio_bucket)
    expiring = {key: t for key, t in tags.items() if "expiring" in key}
    kept = {key: t for key, t in tags.items() if "kept" in key}
    assert expiring and kept and len(expiring) + len(kept) == len(tags)
    assert all(t == dict([EXPIRE_TAG]) for t in expiring.values())
    assert not any(kept.values())
    loaded = store.load("ns.expiring")  # tagged, not changed: it reads back whole till then
    assert len(loaded.history) == len(original.history)


def test_an_encrypted_stores_state_is_tagged_too_and_a_file_stores_kept(
    minio: S3Server, minio_bucket: str, tmp_path: Path
) -> None:
    key = Keyring([("k1", bytes(range(32)))])
    sealed = EncryptedStore(store_in(minio, minio_bucket), key)
    saved(sealed, "ns.sealed", 2)
    assert leave_to_rule(sealed, "ns.sealed", 7).startswith("left to the bucket's rule")
    tags = tags_by_object(minio, minio_bucket)
    assert tags and all(t == dict([EXPIRE_TAG]) for t in tags.values())

    files = FileStore(tmp_path / "runs")
    saved(files, "ns.local", 2)
    assert leave_to_rule(files, "ns.local", 7).startswith("kept")
    assert files.read("ns.local") is not None
    assert not ensure_expiry_rule(files, 7)  # a folder has no lifecycle rules


def deleted(name: str) -> Callable[[Event], bool]:
    return lambda event: event.type == "DELETED" and event.name == name


def finalized(name: str) -> Callable[[Event], bool]:
    return lambda event: event.name == name and bool(event.object["metadata"].get("finalizers"))


def test_the_operator_sets_the_rule_and_leaves_an_expire_runs_state_to_it(
    control_plane: ControlPlane, tmp_path: Path, minio: S3Server, minio_bucket: str
) -> None:
    with operator_in_namespace(control_plane, tmp_path, "expire") as (namespace, _, operator):
        operator.env.update(
            ALPINEAGENTS_STORE=f"s3://{minio_bucket}/runs?endpoint={minio.endpoint}&secure=false",
            AWS_ACCESS_KEY_ID=minio.access_key,
            AWS_SECRET_ACCESS_KEY=minio.secret_key,
            ALPINEAGENTS_STORE_RETENTION_DAYS="7",
        )
        client = control_plane.api_client()
        store = store_in(minio, minio_bucket)
        with (
            EventLog(client, namespace, "pods") as pods,
            EventLog(client, namespace, "agentruns") as runs,
        ):
            operator.start()
            ids = {}
            for name, on_delete in (("expiring", "Expire"), ("kept", "Keep")):
                manifest = agentrun(namespace, name, onDelete=on_delete)
                control_plane.kubectl("create", "-f", "-", input=manifest)
                pods.wait_for(pod_added(name))
                uid = json.loads(
                    control_plane.kubectl(
                        "get", "agentrun", name, "-n", namespace, "-o", "json"
                    ).stdout
                )["metadata"]["uid"]
                ids[name] = state_id_for(namespace, name, uid)
                saved(store, ids[name], 3)  # what its pod saved
            runs.wait_for(finalized("expiring"))  # put by the operator, as for Delete
            for name in ids:
                control_plane.kubectl("delete", "agentrun", name, "-n", namespace, "--wait=false")
            runs.wait_for(deleted("expiring"))  # its finalizer goes once the State is tagged
            runs.wait_for(deleted("kept"))

        # The rule is set by the operator's start, which has no event of its own to await.
        deadline = time.monotonic() + 60
        while rule_id("runs/") not in rules(minio, minio_bucket):
            assert time.monotonic() < deadline, operator.log_text()[-3000:]
            time.sleep(0.5)
        assert rules(minio, minio_bucket)[rule_id("runs/")] == (
            ENABLED,
            "runs/",
            dict([EXPIRE_TAG]),
            7,
        )
        tags = tags_by_object(minio, minio_bucket)
        expiring = [t for key, t in tags.items() if "expiring" in key]
        kept = [t for key, t in tags.items() if "kept" in key]
        assert expiring and all(t == dict([EXPIRE_TAG]) for t in expiring)
        assert kept and not any(kept)
        assert store.read(ids["kept"]) is not None and store.read(ids["expiring"]) is not None
