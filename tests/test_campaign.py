"""The fault campaign of the runtime (issue 13); it writes docs/reliability.md.

Counts and seed come from the environment; the defaults are the issue's minimums:

- ``ALPINEAGENTS_CAMPAIGN_SEED`` (13): the seed of plans, fault kinds and instants.
- ``ALPINEAGENTS_CAMPAIGN_SIGKILLS`` (300) and ``ALPINEAGENTS_CAMPAIGN_CTRL_CS`` (30):
  faults delivered to runs over a FileStore.
- ``ALPINEAGENTS_CAMPAIGN_S3_SIGKILLS`` (40) and ``ALPINEAGENTS_CAMPAIGN_S3_CTRL_CS`` (10):
  the same over a MinioStore on the bench's MinIO.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from alpineagents import FileStore
from alpineagents.minio_store import MinioStore
from alpineagents.testing import ModelServer
from tests.bench.minio_server import S3Server
from tests.campaign.kill_fuzz import KillFuzz
from tests.campaign.report import ReliabilityReport

SEED = int(os.environ.get("ALPINEAGENTS_CAMPAIGN_SEED", "13"))
SIGKILLS = int(os.environ.get("ALPINEAGENTS_CAMPAIGN_SIGKILLS", "300"))
CTRL_CS = int(os.environ.get("ALPINEAGENTS_CAMPAIGN_CTRL_CS", "30"))
S3_SIGKILLS = int(os.environ.get("ALPINEAGENTS_CAMPAIGN_S3_SIGKILLS", "40"))
S3_CTRL_CS = int(os.environ.get("ALPINEAGENTS_CAMPAIGN_S3_CTRL_CS", "10"))


@pytest.fixture(scope="module")
def reliability_report() -> Iterator[ReliabilityReport]:
    """Collects what this module's campaign ran; writes docs/reliability.md at the end."""
    command = (
        f"ALPINEAGENTS_CAMPAIGN_SEED={SEED} ALPINEAGENTS_CAMPAIGN_SIGKILLS={SIGKILLS} "
        f"ALPINEAGENTS_CAMPAIGN_CTRL_CS={CTRL_CS} ALPINEAGENTS_CAMPAIGN_S3_SIGKILLS="
        f"{S3_SIGKILLS} ALPINEAGENTS_CAMPAIGN_S3_CTRL_CS={S3_CTRL_CS} "
        "python -m pytest tests/test_campaign.py"
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
    tmp_path: Path, echo_model: ModelServer, reliability_report: ReliabilityReport
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
    print(totals.line())
    reliability_report.kill_fuzz.append(totals)
    assert totals.sigkills >= SIGKILLS and totals.ctrl_cs >= CTRL_CS


def test_kill_fuzzing_over_minio(
    tmp_path: Path,
    minio: S3Server,
    minio_bucket: str,
    echo_model: ModelServer,
    reliability_report: ReliabilityReport,
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
    print(totals.line())
    reliability_report.kill_fuzz.append(totals)
    assert totals.sigkills >= S3_SIGKILLS and totals.ctrl_cs >= S3_CTRL_CS
