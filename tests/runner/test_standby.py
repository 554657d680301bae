"""A standby runner taking its assignment (:mod:`alpineagents.runner.standby`), without a store.

The hand-over through a real store, with the operator, is in
``tests/operator/test_warm_pool.py``; here: the environment and files it leaves for the
run, and how it follows renewed credentials in its mounted Secret.
"""

from __future__ import annotations

import json
import stat
import threading
import time
from pathlib import Path

from alpineagents.pod_contract import Assignment
from alpineagents.runner.standby import CREDENTIAL_KEYS, apply_assignment, follow_renewals

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
