"""The Debian packages the real node (tests/bench/real_node.py) and its image builds need.

:func:`ensure_packages` installs the missing ones with ``apt-get`` (Debian's own builds:
containerd, runc, the CNI plugins, iptables, conntrack, dnsmasq for Service names,
mmdebstrap and docker.io for building images). When all are installed it only asks
``dpkg-query``, which takes well under a second.
"""

from __future__ import annotations

import os
import shutil
import subprocess

from tests.bench.testbin import ProvisioningError

PACKAGES = (
    "containerd",
    "runc",
    "containernetworking-plugins",
    "iptables",
    "ipset",  # the policy agent's address sets (tests/bench/policy_agent.py)
    "conntrack",
    "socat",
    "ebtables",
    "dnsmasq-base",
    "mmdebstrap",
    "docker.io",
)


def missing_packages(packages: tuple[str, ...] = PACKAGES) -> list[str]:
    """The packages of ``packages`` that dpkg does not list as installed."""
    if shutil.which("dpkg-query") is None:
        raise ProvisioningError("no dpkg-query: the real node needs a Debian-based machine")
    result = subprocess.run(
        ["dpkg-query", "-W", "-f=${Package} ${db:Status-Status}\\n", *packages],
        capture_output=True,
        text=True,
        check=False,
    )
    installed = {
        line.split()[0] for line in result.stdout.splitlines() if line.endswith(" installed")
    }
    return [name for name in packages if name not in installed]


def ensure_packages(packages: tuple[str, ...] = PACKAGES) -> list[str]:
    """Install whatever of ``packages`` is missing; returns what was installed."""
    missing = missing_packages(packages)
    if not missing:
        return []
    if os.geteuid() != 0:
        raise ProvisioningError(
            f"packages {', '.join(missing)} are missing and installing them needs root: "
            f"sudo apt-get install -y --no-install-recommends {' '.join(missing)}"
        )
    env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    for command in (
        ["apt-get", "update", "-q"],
        ["apt-get", "install", "-y", "-q", "--no-install-recommends", *missing],
    ):
        result = subprocess.run(
            command, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
        )
        if result.returncode != 0:
            tail = "\n".join(result.stdout.splitlines()[-20:])
            raise ProvisioningError(f"`{' '.join(command)}` failed:\n{tail}")
    return missing
