"""open_store(url): the one way runner, CLI and operator name a store."""

from __future__ import annotations

from pathlib import Path

import pytest

from alpineagents import FileStore, Message, State
from alpineagents.store.s3 import MinioStore
from alpineagents.store.url import open_store, redact
from tests.bench.stores import S3Place

KEYS = {"AWS_ACCESS_KEY_ID": "AKIDEXAMPLE", "AWS_SECRET_ACCESS_KEY": "s3cr3t-value"}


def test_paths_and_file_urls_open_a_file_store(tmp_path: Path) -> None:
    for url in [
        str(tmp_path / "runs"),
        f"file://{tmp_path}/runs",
        f"file://localhost{tmp_path}/runs",
    ]:
        store = open_store(url, env={})
        assert isinstance(store, FileStore)
        assert store.same_as(FileStore(tmp_path / "runs"))
    relative = open_store(".agent-runs", env={})
    assert isinstance(relative, FileStore) and relative.folder == Path(".agent-runs")


def test_a_file_url_with_a_host_is_refused() -> None:
    with pytest.raises(ValueError, match="three slashes"):
        open_store("file://runs/here", env={})


def test_an_unknown_scheme_names_it_and_the_accepted_ones() -> None:
    with pytest.raises(ValueError, match=r"'gs'.*file:///path or s3://"):
        open_store("gs://bucket/prefix", env={})


def test_an_s3_url_opens_a_minio_store_with_credentials_from_env() -> None:
    store = open_store(
        "s3://agent-runs/team/a?endpoint=minio.svc:9000&secure=false&region=eu-west-1", env=KEYS
    )
    assert isinstance(store, MinioStore)
    assert (store.endpoint, store.bucket, store.prefix) == (
        "http://minio.svc:9000",
        "agent-runs",
        "team/a/",
    )
    assert "s3cr3t" not in repr(store) and "AKID" not in repr(store)
    https = open_store("s3://agent-runs?endpoint=https://objects.example:8443", env=KEYS)
    assert isinstance(https, MinioStore) and https.endpoint == "https://objects.example:8443"


def test_credentials_come_from_files_too(tmp_path: Path) -> None:
    (tmp_path / "user").write_text("minio-user\n")
    (tmp_path / "password").write_text("minio-password\n")
    env = {
        "MINIO_ACCESS_KEY_FILE": str(tmp_path / "user"),
        "MINIO_SECRET_KEY_FILE": str(tmp_path / "password"),
    }
    store = open_store("s3://runs?endpoint=127.0.0.1:1&secure=false", env=env)
    assert isinstance(store, MinioStore)
    credentials = store.client._provider.retrieve()  # type: ignore[union-attr]
    assert (credentials.access_key, credentials.secret_key) == ("minio-user", "minio-password")


def test_missing_or_half_credentials_are_named() -> None:
    with pytest.raises(ValueError, match=r"no credentials.*AWS_ACCESS_KEY_ID"):
        open_store("s3://runs?endpoint=h:1", env={})
    with pytest.raises(ValueError, match="AWS_SECRET_ACCESS_KEY"):
        open_store("s3://runs?endpoint=h:1", env={"AWS_ACCESS_KEY_ID": "x"})


def test_credentials_in_the_url_are_refused_and_redacted() -> None:
    url = "s3://AKID:s3cr3t@runs/prefix?endpoint=h:1"
    with pytest.raises(ValueError, match="credentials") as refused:
        open_store(url, env=KEYS)
    assert "s3cr3t" not in str(refused.value)
    assert redact(url) == "s3://***@runs/prefix?endpoint=h:1"
    assert redact("s3://runs/prefix") == "s3://runs/prefix"


def test_bad_options_are_named() -> None:
    with pytest.raises(ValueError, match=r"unknown option.*colour"):
        open_store("s3://runs?colour=blue", env=KEYS)
    with pytest.raises(ValueError, match="secure"):
        open_store("s3://runs?secure=perhaps", env=KEYS)
    with pytest.raises(ValueError, match="retry_budget"):
        open_store("s3://runs?retry_budget=0", env=KEYS)
    with pytest.raises(ValueError, match="prefix"):
        open_store("s3://runs/a/../b", env=KEYS)


def test_an_s3_url_reaches_the_real_server(s3: S3Place) -> None:
    env = {
        "AWS_ACCESS_KEY_ID": s3.server.access_key,
        "AWS_SECRET_ACCESS_KEY": s3.server.secret_key,
    }
    url = f"s3://{s3.bucket}/runs?endpoint={s3.server.endpoint}&secure=false&retry_budget=5"
    store = open_store(url, env=env)
    state = State("from-url", messages=[Message.user("hello")])
    store.save(state)
    assert open_store(url, env=env).load("from-url") == state
    assert store.same_as(s3.store("runs"))
