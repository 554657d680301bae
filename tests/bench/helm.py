"""The real ``helm`` binary (built from source by :mod:`tests.bench.testbin`) and the chart.

Fixture:

- ``helm`` (session): a :class:`Helm` for ``charts/alpineagents`` with its own config,
  cache and data folders (nothing in ``~/.config/helm`` is read or written). Values are
  passed as a YAML file, never ``--set``, so a test's value keeps its type.

Use ``helm.template(values, namespace=...)`` for the rendered objects as dicts,
``helm.run(...)`` for any other command (its output and exit code), and
``helm.install(...)`` / ``helm.uninstall(...)`` against a kubeconfig.
"""

from __future__ import annotations

import shutil
import subprocess
import tempfile
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.bench.infra import missing
from tests.bench.testbin import ProvisioningError, binary_path
from tests.paths import REPO

CHART = REPO / "charts" / "alpineagents"


class HelmFailed(AssertionError):
    """A helm command that had to succeed did not; the message holds its output."""


@dataclass(frozen=True)
class Helm:
    """The helm binary, a private home for it, and the chart under test."""

    binary: Path
    home: Path
    chart: Path = CHART

    def _env(self) -> dict[str, str]:
        return {
            "PATH": "/usr/bin:/bin",
            "HOME": str(self.home),
            "HELM_CACHE_HOME": str(self.home / "cache"),
            "HELM_CONFIG_HOME": str(self.home / "config"),
            "HELM_DATA_HOME": str(self.home / "data"),
        }

    def run(
        self, *args: str, kubeconfig: Path | None = None, check: bool = True, timeout: float = 300
    ) -> subprocess.CompletedProcess[str]:
        """Run helm; raises :class:`HelmFailed` on a non-zero exit when ``check``."""
        command = [str(self.binary), *args]
        if kubeconfig is not None:
            command.append(f"--kubeconfig={kubeconfig}")
        result = subprocess.run(
            command,
            env=self._env(),
            capture_output=True,
            text=True,
            timeout=timeout,
            check=False,
        )
        if check and result.returncode != 0:
            raise HelmFailed(
                f"`helm {' '.join(args)}` exited {result.returncode}:\n{result.stdout}{result.stderr}"
            )
        return result

    def values_file(self, values: Mapping[str, Any] | None) -> Path:
        """``values`` written to a fresh YAML file in helm's home."""
        with tempfile.NamedTemporaryFile(
            "w", suffix=".yaml", prefix="values-", dir=self.home, delete=False
        ) as handle:
            yaml.safe_dump(dict(values or {}), handle)
        return Path(handle.name)

    def template(
        self,
        values: Mapping[str, Any] | None = None,
        *,
        release: str = "test",
        namespace: str = "default",
        check: bool = True,
    ) -> list[dict[str, Any]]:
        """``helm template``: every rendered object (CRDs included), as dicts."""
        result = self.run(
            "template",
            release,
            str(self.chart),
            "--namespace",
            namespace,
            "--include-crds",
            "--values",
            str(self.values_file(values)),
            check=check,
        )
        return [doc for doc in yaml.safe_load_all(result.stdout) if doc]

    def template_text(
        self,
        values: Mapping[str, Any] | None = None,
        *,
        release: str = "test",
        namespace: str = "default",
    ) -> str:
        """``helm template`` output as text, without the CRDs."""
        return self.run(
            "template",
            release,
            str(self.chart),
            "--namespace",
            namespace,
            "--values",
            str(self.values_file(values)),
        ).stdout

    def refusal(self, values: Mapping[str, Any]) -> str:
        """What ``helm template`` says when it refuses ``values`` (fails if it accepts them)."""
        values_path = self.values_file(values)
        result = self.run(
            "template", "test", str(self.chart), f"--values={values_path}", check=False
        )
        if result.returncode == 0:
            raise AssertionError(f"helm accepted values it should refuse: {dict(values)}")
        return result.stderr

    def install(
        self,
        release: str,
        namespace: str,
        kubeconfig: Path,
        values: Mapping[str, Any] | None = None,
        *extra: str,
    ) -> subprocess.CompletedProcess[str]:
        """``helm install`` into an existing namespace (``extra``: more helm flags)."""
        return self._release("install", release, namespace, kubeconfig, values, *extra)

    def upgrade(
        self,
        release: str,
        namespace: str,
        kubeconfig: Path,
        values: Mapping[str, Any] | None = None,
        *extra: str,
    ) -> subprocess.CompletedProcess[str]:
        """``helm upgrade`` of an installed release to ``values`` (``extra``: more flags)."""
        return self._release("upgrade", release, namespace, kubeconfig, values, *extra)

    def _release(
        self,
        verb: str,
        release: str,
        namespace: str,
        kubeconfig: Path,
        values: Mapping[str, Any] | None,
        *extra: str,
    ) -> subprocess.CompletedProcess[str]:
        return self.run(
            verb,
            release,
            str(self.chart),
            "--namespace",
            namespace,
            "--values",
            str(self.values_file(values)),
            *extra,
            kubeconfig=kubeconfig,
        )

    def uninstall(self, release: str, namespace: str, kubeconfig: Path) -> None:
        """``helm uninstall``, tolerating a release that is already gone."""
        self.run("uninstall", release, "--namespace", namespace, kubeconfig=kubeconfig, check=False)


@pytest.fixture(scope="session")
def helm() -> Iterator[Helm]:
    """helm (v3, pinned in testbin) with a private home, for the chart in charts/."""
    try:
        binary = binary_path("helm")
    except ProvisioningError as error:
        missing("helm", f"run `python -m tests.bench.testbin helm`: {error}")
    home = Path(tempfile.mkdtemp(prefix="alpineagents-helm-"))
    try:
        yield Helm(binary, home)
    finally:
        shutil.rmtree(home, ignore_errors=True)
