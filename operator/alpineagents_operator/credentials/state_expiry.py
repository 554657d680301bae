"""Saved States left to the bucket's own lifecycle rule: ``onDelete: Expire``.

With ``ALPINEAGENTS_STORE_RETENTION_DAYS`` (the chart's ``store.retention.days``) the
operator, once leader, puts one expiration rule on the configured store's bucket
(:func:`ensure_expiry_rule`): objects under the store's prefix that carry the tag
:data:`EXPIRE_TAG` are removed by the bucket itself ``days`` after they were written. Other
rules of the bucket are kept as they are; the operator's own (by its id, one per prefix)
is replaced when the days change.

A run deleted with ``onDelete: Expire`` has its State's objects tagged
(:func:`leave_to_rule`): no State is touched by the rule before its run is deleted, so a
run that lasts longer than ``days`` loses nothing, and ``Keep`` still means kept. A store
without the rule (no days set, a file store) keeps such a State, and the operator says so
in its log.

Why the operator and not a chart hook Job: the operator already holds the store's key (it
creates the bucket and mints each pod's credentials), so setting the rule adds no holder of
that key, no pod, ServiceAccount or RBAC, and works for any S3 store the chart points at,
not only its MinIO. It needs ``s3:GetLifecycleConfiguration``,
``s3:PutLifecycleConfiguration`` and ``s3:PutObjectTagging`` on the bucket, and asks for
them only when the days are set.
"""

from __future__ import annotations

import asyncio
import logging

from minio.commonconfig import ENABLED, AndOperator, Filter, Tags
from minio.error import S3Error
from minio.lifecycleconfig import Expiration, LifecycleConfig, Rule

from alpineagents import Store
from alpineagents.store.s3 import MinioStore

_log = logging.getLogger(__name__)

EXPIRE_TAG = ("alpineagents.dev/expire", "true")
"""The object tag the bucket's rule filters on, put on a State's objects at its run's
deletion (``onDelete: Expire``)."""
RETRY_SECONDS = 60.0
"""How soon a rule that could not be set (store unreachable at start) is tried again."""


def rule_id(prefix: str) -> str:
    """The id of the operator's rule for ``prefix`` (S3 ids are at most 255 characters)."""
    return f"alpineagents-expire {prefix or '(whole bucket)'}"[:255]


def expiry_rule(prefix: str, days: int) -> Rule:
    """Expire objects under ``prefix`` tagged :data:`EXPIRE_TAG`, ``days`` after writing."""
    if days < 1:
        raise ValueError(f"store.retention.days must be at least 1, not {days}")
    tags = Tags()
    tags.update(dict([EXPIRE_TAG]))
    where = Filter(and_operator=AndOperator(prefix=prefix or None, tags=tags))
    return Rule(
        ENABLED, rule_filter=where, rule_id=rule_id(prefix), expiration=Expiration(days=days)
    )


def with_expiry_rule(current: LifecycleConfig | None, prefix: str, days: int) -> LifecycleConfig:
    """``current`` (None: the bucket has none) with the operator's rule for ``prefix`` set
    to ``days``; every other rule as it was."""
    others = [r for r in (current.rules if current else []) if r.rule_id != rule_id(prefix)]
    return LifecycleConfig([*others, expiry_rule(prefix, days)])


def _s3_store(store: Store) -> MinioStore | None:
    """The MinioStore under any wrappers (an encrypted store), or None."""
    while not isinstance(store, MinioStore):
        inner = getattr(store, "inner", None)
        if not isinstance(inner, Store):
            return None
        store = inner
    return store


def ensure_expiry_rule(store: Store, days: int) -> bool:
    """Put the operator's rule for ``store``'s prefix on its bucket (read, merge, write:
    S3 has one lifecycle document per bucket). False for a store without lifecycle rules
    (a file store). Raises what the store raises (unreachable, access denied)."""
    s3 = _s3_store(store)
    if s3 is None:
        return False
    s3.ensure_bucket()
    current = s3.client.get_bucket_lifecycle(s3.bucket)
    wanted = with_expiry_rule(current, s3.prefix, days)
    if current is None or _described(current) != _described(wanted):
        s3.client.set_bucket_lifecycle(s3.bucket, wanted)
        _log.info(
            "bucket %s: objects under %r tagged %s=%s now expire %d days after their write",
            s3.bucket, s3.prefix, *EXPIRE_TAG, days,
        )  # fmt: skip
    return True


async def keep_expiry_rule(store: Store, days: int) -> None:
    """:func:`ensure_expiry_rule` on a worker thread, tried again every
    :data:`RETRY_SECONDS` until the store answers (a missing permission is logged once
    each try, saying what to grant)."""
    while True:
        try:
            if not await asyncio.to_thread(ensure_expiry_rule, store, days):
                _log.warning(
                    "store.retention.days is set but %r has no lifecycle rules: States of "
                    "runs with onDelete: Expire are kept",
                    store,
                )
            return
        except S3Error as error:
            _log.warning(
                "could not set the bucket's expiry rule (%s: %s); the operator's store key "
                "needs s3:GetLifecycleConfiguration and s3:PutLifecycleConfiguration on the "
                "bucket. Trying again in %.0f s",
                error.code, error.message, RETRY_SECONDS,
            )  # fmt: skip
        except Exception as error:  # unreachable store: it may come up later
            _log.warning(
                "could not set the bucket's expiry rule (%s); trying again in %.0f s",
                error,
                RETRY_SECONDS,
            )
        await asyncio.sleep(RETRY_SECONDS)


def leave_to_rule(store: Store, state_id: str, days: int | None) -> str:
    """Tag the State's objects for the bucket's rule (``onDelete: Expire``); what became
    of it, for the log. Without the rule (``days`` None, a file store) it is kept."""
    s3 = _s3_store(store)
    if days is None or s3 is None:
        why = "no store.retention.days" if days is None else "its store has no lifecycle rules"
        return f"kept ({why}: onDelete: Expire keeps it)"
    tagged = s3.tag_state(state_id, dict([EXPIRE_TAG]))
    return f"left to the bucket's rule ({tagged} objects, {days} days after their write)"


def _described(config: LifecycleConfig) -> list[tuple[object, ...]]:
    """The rules as comparable values (the library's Rule has no equality)."""
    rules = []
    for rule in config.rules:
        where = rule.rule_filter
        both = where.and_operator if where else None
        rules.append(
            (
                rule.rule_id,
                rule.status,
                where.prefix if where else None,
                both.prefix if both else None,
                dict(both.tags or {}) if both else None,
                rule.expiration.days if rule.expiration else None,
            )
        )
    return sorted(rules, key=repr)
