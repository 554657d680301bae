"""Standby mode: a warm pool's pod, started and imported, waiting to be handed a run.

A pod the operator starts with :data:`~alpineagents.pod_contract.ENV_STANDBY_ID` set (its
own pod uid) runs ``alpineagents run`` as every run pod does, but :func:`take_assignment`
comes first: it imports what a run needs (the runner, the store client, the model
client), then asks the store for an :class:`~alpineagents.pod_contract.Assignment` in
its own folder (:class:`~alpineagents.store.s3.standby_boxes.StandbyBoxes`): when its
doorbell rings (:data:`~alpineagents.pod_contract.ENV_STANDBY_DOORBELL`, a file that
changes when the operator relabels the pod for a run) and every :data:`BACKSTOP_SECONDS`;
without a doorbell, every :data:`POLL_SECONDS`. Once one is there it makes
this process's environment what a run pod's would be (the spec as a file, the State id,
the attempt, the run's own store credentials as files) and the run goes on as in any pod:
it loads the State, claims it and saves; the fence decides between it and any other
writer, as for a new pod.

The run's credentials are renewed by the operator in the Secret the standby mounted for
its own (the kubelet updates the files in place): :func:`follow_renewals` copies each new
set next to the first one, where the store reads them.
"""

from __future__ import annotations

import json
import logging
import os
import threading
import time
from collections.abc import Mapping, MutableMapping
from pathlib import Path

from ..pod_contract import (
    ENV_ATTEMPT,
    ENV_SPEC,
    ENV_SPEC_FILE,
    ENV_STANDBY_DOORBELL,
    ENV_STANDBY_ID,
    ENV_STATE_ID,
    ENV_STORE,
    Assignment,
)

__all__ = [
    "BACKSTOP_SECONDS",
    "CREDENTIAL_KEYS",
    "DOORBELL_CHECK_SECONDS",
    "POLL_SECONDS",
    "RENEWAL_CHECK_SECONDS",
    "apply_assignment",
    "follow_renewals",
    "preload",
    "take_assignment",
]

_log = logging.getLogger(__name__)

POLL_SECONDS = 0.2
"""How often a standby without a doorbell asks the store for its assignment (a GET of a
missing key, about 1.5 ms of CPU between the runner and MinIO)."""
BACKSTOP_SECONDS = 1.0
"""How often a standby with a doorbell asks the store anyway: should the kubelet be slow to
ring it, a hand-over waits no longer than this."""
DOORBELL_CHECK_SECONDS = 0.1
"""How often a standby reads its doorbell (a local file of a few hundred bytes)."""
RENEWAL_CHECK_SECONDS = 10.0
"""How often a run on a standby pod looks for renewed credentials in its mounted Secret."""
CREDENTIAL_KEYS = ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN")
_ERROR_LOG_SECONDS = 60.0  # a store that stays away is logged once a minute, not per poll


def preload() -> None:
    """Import what a run imports on its way to its first save, so a handed run does not
    wait for it: the model client, the store client, the agent and its tools."""
    import anthropic  # noqa: F401
    import minio  # noqa: F401

    from .. import agent, builtin_tools  # noqa: F401
    from ..store.s3 import MinioStore  # noqa: F401
    from . import build, run  # noqa: F401


def take_assignment(
    env: MutableMapping[str, str] | None = None,
    *,
    folder: Path | None = None,
    poll: float | None = None,
) -> Assignment:
    """Wait for this standby's assignment, then make ``env`` (default ``os.environ``) a
    run pod's environment for it (:func:`apply_assignment`). The store is asked when the
    doorbell rings and every ``poll`` seconds (default :data:`BACKSTOP_SECONDS` with a
    doorbell, :data:`POLL_SECONDS` without). Store errors while waiting are logged and
    waited out: the operator replaces a standby that is no use."""
    from ..store.s3.standby_boxes import StandbyBoxes

    env = os.environ if env is None else env
    preload()
    standby_id = env[ENV_STANDBY_ID]
    boxes = StandbyBoxes.open(env[ENV_STORE], env)
    doorbell = env.get(ENV_STANDBY_DOORBELL)
    wait = _Doorbell(Path(doorbell)).wait if doorbell else time.sleep
    if poll is None:
        poll = BACKSTOP_SECONDS if doorbell else POLL_SECONDS
    _log.info("standby %s: waiting for a run", standby_id)
    logged_at = 0.0
    while True:
        try:
            assignment = boxes.take(standby_id)
        except Exception as error:  # any failure: keep waiting; the next poll may work
            if time.monotonic() - logged_at > _ERROR_LOG_SECONDS:
                _log.warning("standby %s: cannot read the store: %s", standby_id, error)
                logged_at = time.monotonic()
            assignment = None
        if assignment is not None:
            break
        wait(poll)
    apply_assignment(assignment, env, folder or Path(env.get("TMPDIR") or "/tmp") / "run")
    return assignment


class _Doorbell:
    """A file that changes when the standby is handed a run (its labels, as the kubelet
    projects them)."""

    def __init__(self, path: Path) -> None:
        self._path = path
        self._seen = self._read()

    def _read(self) -> bytes | None:
        try:
            return self._path.read_bytes()
        except OSError:  # absent, or being swapped by the kubelet: as if unchanged
            return None

    def wait(self, seconds: float) -> None:
        """Return once the file has changed since the last look, or after ``seconds``."""
        deadline = time.monotonic() + seconds
        while (left := deadline - time.monotonic()) > 0:
            time.sleep(min(DOORBELL_CHECK_SECONDS, left))
            now = self._read()
            if now is not None and now != self._seen:
                self._seen = now
                return


def apply_assignment(
    assignment: Assignment, env: MutableMapping[str, str], folder: Path
) -> threading.Thread | None:
    """Set ``env`` as a run pod's for ``assignment``; files go to ``folder`` (owner only).

    Returns the thread that follows credential renewals (None: the run has no
    credentials of its own, or the standby had no credential files to follow)."""
    folder.mkdir(mode=0o700, parents=True, exist_ok=True)
    spec_file = folder / "spec.json"
    _write_private(spec_file, json.dumps(dict(assignment.spec), ensure_ascii=False))
    env.pop(ENV_STANDBY_ID, None)
    env.pop(ENV_STANDBY_DOORBELL, None)
    env.pop(ENV_SPEC, None)
    env[ENV_SPEC_FILE] = str(spec_file)
    env[ENV_STORE] = assignment.store
    env[ENV_STATE_ID] = assignment.state_id
    env[ENV_ATTEMPT] = str(assignment.attempt)
    if assignment.credentials is None:
        return None
    mounted_file = env.get("AWS_ACCESS_KEY_ID_FILE")
    standby_key = Path(mounted_file).read_text().strip() if mounted_file else None
    current = folder / "credentials"
    _swap_credentials(current, assignment.credentials)
    for key in CREDENTIAL_KEYS:
        env.pop(key, None)
        env[f"{key}_FILE"] = str(current / key)
    if mounted_file is None or standby_key is None:
        return None
    follower = threading.Thread(
        target=follow_renewals,
        args=(
            Path(mounted_file).parent,
            current,
            {standby_key, assignment.credentials.get(CREDENTIAL_KEYS[0], "")},
        ),
        name="credential-renewals",
        daemon=True,
    )
    follower.start()
    return follower


def follow_renewals(
    mounted: Path,
    current: Path,
    seen: set[str],
    *,
    every: float = RENEWAL_CHECK_SECONDS,
    stop: threading.Event | None = None,
) -> None:
    """Copy credentials that appear in ``mounted`` (the standby's Secret, where the
    operator puts the run's renewals) to ``current`` when their access key is not one of
    ``seen`` (the standby's own, and those copied already). Runs until ``stop`` is set."""
    stop = stop or threading.Event()
    while not stop.wait(every):
        try:
            values = {key: (mounted / key).read_text().strip() for key in CREDENTIAL_KEYS}
        except OSError:
            continue  # being swapped by the kubelet: look again next time
        if values[CREDENTIAL_KEYS[0]] in seen or not all(values.values()):
            continue
        _swap_credentials(current, values)
        seen.add(values[CREDENTIAL_KEYS[0]])
        _log.info("renewed store credentials in place")


def _swap_credentials(current: Path, values: Mapping[str, str]) -> None:
    """Write a set of credentials to a new folder and point ``current`` at it in one
    rename, so a reader never sees half of one set (as the kubelet does with a Secret)."""
    version = current.parent / f".credentials-{time.monotonic_ns()}"
    version.mkdir(mode=0o700)
    for key in CREDENTIAL_KEYS:
        _write_private(version / key, str(values.get(key, "")))
    link = current.parent / f".credentials-link-{time.monotonic_ns()}"
    link.symlink_to(version.name)
    os.replace(link, current)


def _write_private(path: Path, text: str) -> None:
    descriptor = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(descriptor, "w", encoding="utf-8") as file:
        file.write(text)
