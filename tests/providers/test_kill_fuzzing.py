"""The fault campaign's kill fuzzing on each provider: forked runs asking their model
through Bedrock's, Vertex AI's, Foundry's or a gateway's wire, SIGKILLed and Ctrl+C'd at
random instants and resumed, hold every invariant of the persistence contract (the same
checks as tests/runtime/test_campaign.py, fewer faults).

``ALPINEAGENTS_PROVIDER_SIGKILLS`` (10) and ``ALPINEAGENTS_PROVIDER_CTRL_CS`` (2) set the
faults per provider; the seed is the campaign's."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from alpineagents import FileStore
from alpineagents.testing import ModelServer
from alpineagents.testing.vertex_wire import MetadataServer
from tests.campaign.child import ENV_MODEL, ENV_PROVIDER
from tests.campaign.kill_fuzz import KillFuzz
from tests.providers.conftest import CLOUDS, cloud_for, no_ambient_credentials

SEED = int(os.environ.get("ALPINEAGENTS_CAMPAIGN_SEED", "13"))
SIGKILLS = int(os.environ.get("ALPINEAGENTS_PROVIDER_SIGKILLS", "10"))
CTRL_CS = int(os.environ.get("ALPINEAGENTS_PROVIDER_CTRL_CS", "2"))


@pytest.mark.parametrize("name", CLOUDS)
def test_kill_fuzzing_through_each_provider(
    name: str, tmp_path: Path, metadata_server: MetadataServer
) -> None:
    folder = tmp_path / "runs"
    with (
        ModelServer(echo=True) as model,
        cloud_for(name, model, tmp_path, metadata_server) as cloud,
    ):
        env = {
            **no_ambient_credentials(tmp_path),
            **cloud.env,
            ENV_PROVIDER: json.dumps(cloud.spec),
            ENV_MODEL: cloud.model_id,
        }
        fuzz = KillFuzz(
            kind=f"provider-{name}",
            store_url=f"file://{folder}",
            open_store=lambda: FileStore(folder),
            child_env=env,
            model=model,
            markers=tmp_path / "markers",
            seed=SEED,
        )
        totals = fuzz.run(SIGKILLS, CTRL_CS)
        assert totals.sigkills >= SIGKILLS and totals.ctrl_cs >= CTRL_CS
        assert cloud.refused() == []
        # (a request cut off by a kill mid-send arrives with no body)
        assert {r.body["model"] for r in model.requests if r.body} == {cloud.model_id}
        saved = "\n".join(p.read_text() for p in folder.rglob("*") if p.is_file())
        for secret in cloud.secrets():
            assert secret not in saved
