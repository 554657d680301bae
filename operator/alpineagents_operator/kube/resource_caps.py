"""The most a run may ask for: the platform's cap on each amount of ``spec.resources``.

The chart's ``runs.maxResources`` (``ALPINEAGENTS_RUN_MAX_RESOURCES``) caps each resource
(``cpu``, ``memory``, ``ephemeral-storage``, ...) for requests and limits alike. A run
asking more is refused (:mod:`.refusals`, reason ``ResourcesNotAllowed``) before its pod
exists, instead of taking a node's memory or disk that the platform never meant to give.
Amounts are Kubernetes quantities (``500m``, ``1Gi``, ``2e9``), compared exactly.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from decimal import Decimal, InvalidOperation
from typing import Any

__all__ = ["parse_quantity", "resources_over_cap"]

_SUFFIXES: Mapping[str, Decimal] = {
    **{
        suffix: Decimal(1024) ** power
        for power, suffix in enumerate(("", "Ki", "Mi", "Gi", "Ti", "Pi", "Ei"))
    },
    "n": Decimal("1e-9"),
    "u": Decimal("1e-6"),
    "m": Decimal("1e-3"),
    "k": Decimal("1e3"),
    "M": Decimal("1e6"),
    "G": Decimal("1e9"),
    "T": Decimal("1e12"),
    "P": Decimal("1e15"),
    "E": Decimal("1e18"),
}
_QUANTITY = re.compile(r"([+-]?(?:[0-9]+(?:\.[0-9]*)?|\.[0-9]+))((?:[eE][+-]?[0-9]+)|[a-zA-Z]*)")


def parse_quantity(amount: str | int | float) -> Decimal:
    """A Kubernetes quantity's value (``"1Gi"`` is 1073741824, ``"500m"`` is 0.5).

    Raises ValueError for anything else."""
    if isinstance(amount, bool):
        raise ValueError(f"{amount!r} is not a quantity")
    if isinstance(amount, (int, float)):
        return Decimal(str(amount))
    match = _QUANTITY.fullmatch(amount.strip())
    if match is None:
        raise ValueError(f"{amount!r} is not a quantity")
    number, suffix = match.groups()
    try:
        if suffix not in _SUFFIXES:  # an exponent: 2e9
            return Decimal(number + suffix)
        return Decimal(number) * _SUFFIXES[suffix]
    except (KeyError, InvalidOperation):
        raise ValueError(f"{amount!r} is not a quantity") from None


def resources_over_cap(resources: Any, caps: Mapping[str, str]) -> str | None:
    """Which amount of ``resources`` (a run's ``spec.resources``) is over its cap in
    ``caps``, or is no quantity at all (None: every amount is within the caps)."""
    if not isinstance(resources, Mapping):
        return None
    for part in ("requests", "limits"):
        amounts = resources.get(part)
        if not isinstance(amounts, Mapping):
            continue
        for resource, amount in amounts.items():
            try:
                asked = parse_quantity(amount)
            except ValueError:
                return f"spec.resources.{part}.{resource} must be a quantity like '1Gi' or '500m'"
            cap = caps.get(resource)
            if cap is not None and asked > parse_quantity(cap):
                return (
                    f"spec.resources.{part}.{resource} asks {amount}, more than the "
                    f"{cap} the platform allows a run (the chart's runs.maxResources)"
                )
    return None
