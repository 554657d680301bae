"""A standby runner taking its assignment (:mod:`alpineagents.runner.standby`).

The hand-over through a real store, with the operator, is in
``tests/operator/test_warm_pool.py``; here: the environment and files it leaves for the
run, how it follows renewed credentials in its mounted Secret, and how its doorbell (its
labels' file) has it ask the store for its assignment when it rings (real MinIO).
"""

from __future__ import annotations

import json
import stat
import threading
import time
from pathlib import Path

import pytest

from alpineagents.pod_contract import Assignment
from alpineagents.runner.standby import (
    CREDENTIAL_KEYS,
    apply_assignment,
    follow_renewals,
    take_assignment,
)
from alpineagents.store.s3.standby_boxes import StandbyBoxes
from tests.bench.minio_server import S3Server

DEADLINE = 30.0  # a safety net, never a measurement


def credentials(n: int) -> dict[str, str]:
    return dict(zip(CREDENTIAL_KEYS, (f"key-{n}", f"secret-{n}", f"token-{n}"), strict=True))


def mount(folder: Path, values: dict[str, str]) -> Path:
    folder.mkdir(exist_ok=True)
    for key, value in values.items():
        (folder / key).write_text(value)
    return folder


def test_the_run_gets_a_run_pods_environment_with_private_files(tmp_path: Path) -> None:
    mounted = mount(tmp_path / "mounted", credentials(0))  # the standby's own
    env = {
        "ALPINEAGENTS_STANDBY_ID": "uid-1",
        "ALPINEAGENTS_STORE": "s3://pool/x",
        "AWS_ACCESS_KEY_ID_FILE": str(mounted / "AWS_ACCESS_KEY_ID"),
    }
    assignment = Assignment(
        "team", "job", {"prompt": "hi"}, "team.job.0123", 3, "s3://pool/x", credentials(1)
    )
    follower = apply_assignment(assignment, env, tmp_path / "run")
    assert follower is not None and follower.daemon
    assert "ALPINEAGENTS_STANDBY_ID" not in env
    assert env["ALPINEAGENTS_STATE_ID"] == "team.job.0123" and env["ALPINEAGENTS_ATTEMPT"] == "3"
    spec = Path(env["ALPINEAGENTS_SPEC_FILE"])
    assert json.loads(spec.read_text()) == {"prompt": "hi"}
    for key in CREDENTIAL_KEYS:
        path = Path(env[f"{key}_FILE"])
        assert path.read_text() == credentials(1)[key]
        assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert stat.S_IMODE(spec.stat().st_mode) == 0o600


def test_renewed_credentials_in_the_mounted_secret_replace_the_runs_files(tmp_path: Path) -> None:
    mounted = mount(tmp_path / "mounted", credentials(0))
    env = {"AWS_ACCESS_KEY_ID_FILE": str(mounted / "AWS_ACCESS_KEY_ID")}
    assignment = Assignment("team", "job", {}, "team.job.0123", 2, "s3://pool/x", credentials(1))
    apply_assignment(assignment, env, tmp_path / "run")  # its own follower: checks every 10 s
    current = Path(env["AWS_ACCESS_KEY_ID_FILE"]).parent
    stop = threading.Event()
    seen = {"key-0", "key-1"}
    follower = threading.Thread(
        target=follow_renewals, args=(mounted, current, seen), kwargs={"every": 0.01, "stop": stop}
    )
    follower.start()
    try:
        mount(mounted, credentials(2))  # the operator's renewal, as the kubelet writes it
        deadline = time.monotonic() + DEADLINE
        while (current / "AWS_ACCESS_KEY_ID").read_text() != "key-2":
            assert time.monotonic() < deadline, "the renewal was not followed"
            time.sleep(0.01)
        assert {k: (current / k).read_text() for k in CREDENTIAL_KEYS} == credentials(2)
    finally:
        stop.set()
        follower.join()


def test_a_standby_asks_the_store_when_its_doorbell_rings(
    minio: S3Server, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Its backstop is an hour: only the doorbell can have it ask again in this test.
    url = f"s3://{minio.bucket}/{minio.unique_prefix()}?endpoint=http://{minio.endpoint}"
    doorbell = tmp_path / "labels"
    doorbell.write_text('alpineagents.dev/standby="true"')
    env = {
        "ALPINEAGENTS_STANDBY_ID": "uid-1",
        "ALPINEAGENTS_STORE": url,
        "ALPINEAGENTS_STANDBY_DOORBELL": str(doorbell),
        "AWS_ACCESS_KEY_ID": minio.access_key,
        "AWS_SECRET_ACCESS_KEY": minio.secret_key,
    }
    asked = threading.Event()
    take = StandbyBoxes.take

    def take_and_tell(boxes: StandbyBoxes, standby_id: str) -> Assignment | None:
        try:
            return take(boxes, standby_id)
        finally:
            asked.set()

    monkeypatch.setattr(StandbyBoxes, "take", take_and_tell)
    taken: list[Assignment] = []
    standby = threading.Thread(
        target=lambda: taken.append(take_assignment(env, folder=tmp_path / "run", poll=3600)),
        daemon=True,
    )
    standby.start()
    assert asked.wait(DEADLINE), "the standby never asked the store"
    assignment = Assignment("team", "job", {"prompt": "hi"}, "team.job.0123", 2, url, None)
    StandbyBoxes.open(url, env).put("uid-1", assignment)
    # The kubelet's rewrite of the file when the operator relabels the pod.
    doorbell.write_text('alpineagents.dev/standby="taken"')
    standby.join(DEADLINE)
    assert taken == [assignment]
    assert env["ALPINEAGENTS_STATE_ID"] == "team.job.0123"
    assert "ALPINEAGENTS_STANDBY_DOORBELL" not in env  # a run pod's environment now
    assert not StandbyBoxes.open(url, env).holds("uid-1")  # taken out of the store
