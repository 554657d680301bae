"""Per-run store credentials: short-lived keys that reach one run's States and nothing else.

The operator holds the store's broad key; run pods never see it. For each pod it starts,
the operator asks the store's STS for temporary credentials (``AssumeRole`` with an
inline session policy, :func:`run_policy`) that may only

- get, put and delete objects under the run's State folder ``<prefix><id>/`` and its
  subagents' folders ``<prefix><id>%2Etoolu_<...>/`` (a subagent's id is
  ``"<parent id>.<call id>"``, ``.`` is encoded as ``%2E`` in keys, and the API's call
  ids start ``toolu_``, which no AgentRun's id can), and
- list keys under those folders.

Everything else is refused by the store (403): other runs' folders, listing the bucket or
its root, other buckets, creating buckets, the admin and STS APIs. The credentials reach
the pod in a Secret owned by the AgentRun (:func:`credentials_secret`), mounted as files
that the runner reads again when they change; the operator mints new ones for every pod
it starts and renews them while a pod runs (:func:`renew_at`).

Each pod's credentials carry a revocation tag of its own, the run's State id and the pod's
attempt (MinIO's ``TokenRevokeType``). When a pod is replaced, the operator revokes the
credentials of the pod before it (:func:`revoke_attempt_credentials`, MinIO's admin
``revoke-tokens``): what a replaced pod held, or what a shell in it copied, is refused from
then on instead of working until it expires. AWS has neither: with a role ARN (which AWS
needs and MinIO ignores) no tag is sent and nothing is revoked.

This module is plain functions on typed values; the operator's reconciler calls them. The
STS call is one signed POST (``minio``'s SigV4 signer), so it works with any S3 service
that has AssumeRole: MinIO, AWS S3 (give a role ARN), SeaweedFS with its IAM/STS set up.
"""

from __future__ import annotations

import base64
import json
import re
import xml.etree.ElementTree as ElementTree
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from urllib.parse import urlencode, urlsplit

import urllib3

from alpineagents.pod_contract import STANDBY_LABEL, standby_prefix
from alpineagents.store.base import encode_id
from alpineagents.store.url import s3_credentials, s3_location
from alpineagents_operator.kube.config import MAX_CREDENTIALS_SECONDS, MIN_CREDENTIALS_SECONDS
from alpineagents_operator.kube.pods import (
    CREDENTIALS_KEYS,
    owner_reference,
    run_labels,
    standby_credentials_secret_name,
)
from alpineagents_operator.kube.views import GROUP, JSON, AgentRunView, credentials_secret_name

__all__ = [
    "CredentialsRefused",
    "CredentialsUnavailable",
    "RunCredentials",
    "StsAccess",
    "credentials_secret",
    "mint_run_credentials",
    "mint_standby_credentials",
    "renew_at",
    "revoke_attempt_credentials",
    "revoke_standby_credentials",
    "revoke_tag",
    "run_policy",
    "standby_credentials_secret",
    "standby_policy",
    "standby_revoke_tag",
]

EXPIRES_ANNOTATION = f"{GROUP}/expires-at"
MIN_LIFETIME = timedelta(seconds=MIN_CREDENTIALS_SECONDS)
MAX_LIFETIME = timedelta(seconds=MAX_CREDENTIALS_SECONDS)

_STS_NAMESPACE = "{https://sts.amazonaws.com/doc/2011-06-15/}"
_SESSION_NAME = re.compile(r"[^\w+=,.@-]")
_POLICY_WILDCARDS = re.compile(r"[*?$]")  # would widen a policy's resource patterns
# One pool for every mint and revocation: a burst of resumes makes dozens at once, and a
# pool per call opened a new connection to the store for each.
_HTTP = urllib3.PoolManager(maxsize=32)


class CredentialsRefused(RuntimeError):
    """The store answered ``AssumeRole`` with an error (no STS, denied, bad policy)."""

    def __init__(self, status: int, code: str, message: str) -> None:
        super().__init__(f"the store refused AssumeRole ({status} {code}): {message}")
        self.status = status
        self.code = code


class CredentialsUnavailable(ConnectionError):
    """The store's STS did not answer (connection refused, timeout)."""


@dataclass(frozen=True)
class RunCredentials:
    """Temporary store credentials for one run; the secret parts stay out of ``repr``."""

    access_key: str
    secret_key: str = field(repr=False)
    session_token: str = field(repr=False)
    expires_at: datetime

    def secret_data(self) -> dict[str, str]:
        """The Secret's keys and values: one file each in the pod."""
        return dict(
            zip(
                CREDENTIALS_KEYS,
                (self.access_key, self.secret_key, self.session_token),
                strict=True,
            )
        )


@dataclass(frozen=True)
class StsAccess:
    """What minting needs: where the store is, which bucket and prefix, the broad key."""

    endpoint_url: str
    """``http(s)://host:port`` of the store (STS answers at its root)."""
    region: str
    bucket: str
    prefix: str
    """``""`` or ``"a/b/"``, as MinioStore keys it."""
    access_key: str
    secret_key: str = field(repr=False)
    role_arn: str | None = None
    """AWS needs a role to assume (its permissions are intersected with the policy);
    MinIO ignores it and derives the session from ``access_key``'s user."""

    @classmethod
    def for_store(
        cls, store_url: str, env: Mapping[str, str], role_arn: str | None = None
    ) -> StsAccess:
        """From an ``s3://`` store URL and the operator's environment (its broad key).

        Raises ``ValueError`` for a URL that is not ``s3://``, has no credentials, or whose
        bucket or prefix holds ``*``, ``?`` or ``$`` (they would widen the policy).
        """
        where = s3_location(store_url, env)
        key = s3_credentials(store_url, env)
        stripped = where.prefix.strip("/")
        if _POLICY_WILDCARDS.search(where.bucket + stripped):
            raise ValueError(
                f"store s3://{where.bucket}/{stripped}: '*', '?' and '$' in a bucket or "
                f"prefix would widen the runs' credentials; pick a prefix without them"
            )
        return cls(
            endpoint_url=where.endpoint_url,
            region=where.region,
            bucket=where.bucket,
            prefix=stripped + "/" if stripped else "",
            access_key=key.access_key,
            secret_key=key.secret_key,
            role_arn=role_arn or None,
        )


def run_policy(bucket: str, prefix: str, state_id: str) -> JSON:
    """The session policy of a run's credentials: its State folder and its subagents'."""
    folder = f"{prefix}{encode_id(state_id)}"
    # A subagent's id is "<id>.<call id>", and the API's call ids start "toolu_": an
    # underscore no AgentRun name (a DNS name) has, so "<id>.<uid>" of another run named
    # "<name>.<uid prefix>" is not among them.
    subagents = folder + encode_id(".toolu_")
    return {
        "Version": "2012-10-17",
        "Statement": [
            {
                "Sid": "ThisRunsStates",
                "Effect": "Allow",
                "Action": ["s3:GetObject", "s3:PutObject", "s3:DeleteObject"],
                "Resource": [
                    f"arn:aws:s3:::{bucket}/{folder}/*",
                    f"arn:aws:s3:::{bucket}/{subagents}*",
                ],
            },
            {
                "Sid": "ListOnlyThere",
                "Effect": "Allow",
                "Action": ["s3:ListBucket"],
                "Resource": [f"arn:aws:s3:::{bucket}"],
                "Condition": {"StringLike": {"s3:prefix": [f"{folder}/*", f"{subagents}*"]}},
            },
        ],
    }


def revoke_tag(state_id: str, attempt: int) -> str:
    """The revocation tag of the credentials of a run's pod ``attempt``."""
    return f"{state_id}#{attempt}"


def mint_run_credentials(
    access: StsAccess,
    state_id: str,
    lifetime: timedelta,
    *,
    attempt: int | None = None,
    timeout: float = 10.0,
    http: urllib3.PoolManager | None = None,
) -> RunCredentials:
    """Ask the store's STS for credentials limited to :func:`run_policy` for ``lifetime``,
    tagged for pod ``attempt`` (see :func:`revoke_attempt_credentials`).

    Raises :class:`CredentialsRefused` when the store answers with an error and
    :class:`CredentialsUnavailable` when it does not answer.
    """
    return _assume_role(
        access,
        run_policy(access.bucket, access.prefix, state_id),
        _session_name(state_id),
        revoke_tag(state_id, attempt) if attempt is not None else None,
        lifetime,
        timeout=timeout,
        http=http,
    )


def standby_policy(bucket: str, prefix: str, standby_id: str) -> JSON:
    """The session policy of a warm pool standby's credentials: its own folder only,
    where it finds its assignment (get, delete; list, so a missing one is a 404)."""
    folder = prefix + standby_prefix(standby_id)
    return {
        "Version": "2012-10-17",
        "Statement": [
            {
                "Sid": "ThisStandbysAssignment",
                "Effect": "Allow",
                "Action": ["s3:GetObject", "s3:DeleteObject"],
                "Resource": [f"arn:aws:s3:::{bucket}/{folder}*"],
            },
            {
                "Sid": "ListOnlyThere",
                "Effect": "Allow",
                "Action": ["s3:ListBucket"],
                "Resource": [f"arn:aws:s3:::{bucket}"],
                "Condition": {"StringLike": {"s3:prefix": [f"{folder}*"]}},
            },
        ],
    }


def standby_revoke_tag(standby_id: str) -> str:
    """The revocation tag of a standby's own credentials."""
    return f"standby#{standby_id}"


def mint_standby_credentials(
    access: StsAccess, standby_id: str, lifetime: timedelta, *, timeout: float = 10.0
) -> RunCredentials:
    """Credentials limited to :func:`standby_policy` (see :func:`mint_run_credentials`)."""
    return _assume_role(
        access,
        standby_policy(access.bucket, access.prefix, standby_id),
        _session_name(f"standby-{standby_id}"),
        standby_revoke_tag(standby_id),
        lifetime,
        timeout=timeout,
        http=None,
    )


def revoke_standby_credentials(access: StsAccess, standby_id: str) -> bool:
    """Revoke a standby's own credentials (see :func:`revoke_attempt_credentials`)."""
    return _revoke(access, standby_revoke_tag(standby_id), timeout=10.0, http=None)


def _assume_role(
    access: StsAccess,
    policy: JSON,
    session_name: str,
    tag: str | None,
    lifetime: timedelta,
    *,
    timeout: float,
    http: urllib3.PoolManager | None,
) -> RunCredentials:
    if not MIN_LIFETIME <= lifetime <= MAX_LIFETIME:
        raise ValueError(
            f"credentials lifetime {lifetime} is outside what STS grants "
            f"({MIN_LIFETIME} to {MAX_LIFETIME})"
        )
    form = {
        "Action": "AssumeRole",
        "Version": "2011-06-15",
        "DurationSeconds": str(int(lifetime.total_seconds())),
        "RoleSessionName": session_name,
        "Policy": json.dumps(policy),
    }
    if access.role_arn:
        form["RoleArn"] = access.role_arn
    elif tag is not None:
        form["TokenRevokeType"] = tag
    response = _signed_post(access, "/", urlencode(form), sts=True, timeout=timeout, http=http)
    if response.status != 200:
        code, message = _error_of(response.data)
        raise CredentialsRefused(response.status, code, message)
    return _parse_credentials(response.data)


def revoke_attempt_credentials(
    access: StsAccess,
    state_id: str,
    attempt: int,
    *,
    timeout: float = 10.0,
    http: urllib3.PoolManager | None = None,
) -> bool:
    """Revoke every credential minted for pod ``attempt`` of the run (its first ones and
    each renewal) through MinIO's admin API. False when there is nothing to revoke by
    (a role ARN: AWS, whose credentials cannot be revoked one session at a time).

    Raises :class:`CredentialsRefused` when the store answers with an error and
    :class:`CredentialsUnavailable` when it does not answer.
    """
    return _revoke(access, revoke_tag(state_id, attempt), timeout=timeout, http=http)


def _revoke(
    access: StsAccess, tag: str, *, timeout: float, http: urllib3.PoolManager | None
) -> bool:
    if access.role_arn:
        return False
    query = urlencode({"user": access.access_key, "tokenRevokeType": tag})
    path = f"/minio/admin/v3/revoke-tokens/builtin?{query}"
    response = _signed_post(access, path, "", sts=False, timeout=timeout, http=http)
    if response.status not in (200, 204):
        code, message = _error_of(response.data)
        raise CredentialsRefused(response.status, code, message)
    return True


def renew_at(expires_at: datetime, lifetime: timedelta) -> datetime:
    """When to mint new credentials for a running pod: with half their lifetime left.

    Half leaves the kubelet ample time (about a minute) to update the mounted files.
    """
    return expires_at - lifetime / 2


def credentials_secret(run: AgentRunView, credentials: RunCredentials) -> JSON:
    """The Secret holding a run's credentials, owned by (and deleted with) the AgentRun."""
    return {
        "apiVersion": "v1",
        "kind": "Secret",
        "type": "Opaque",
        "metadata": {
            "name": credentials_secret_name(run.name),
            "namespace": run.namespace,
            "labels": run_labels(run.name),
            "annotations": {EXPIRES_ANNOTATION: _format(credentials.expires_at)},
            "ownerReferences": [owner_reference(run)],
        },
        "data": {
            key: base64.b64encode(value.encode()).decode()
            for key, value in credentials.secret_data().items()
        },
    }


def standby_credentials_secret(
    namespace: str, pod_name: str, pod_uid: str, credentials: RunCredentials
) -> JSON:
    """The Secret a standby pod mounts its credentials from, owned by (and deleted with)
    the pod; the operator puts the run's in it once it hands the pod a run."""
    return {
        "apiVersion": "v1",
        "kind": "Secret",
        "type": "Opaque",
        "metadata": {
            "name": standby_credentials_secret_name(pod_name),
            "namespace": namespace,
            "labels": {STANDBY_LABEL: "true"},
            "annotations": {EXPIRES_ANNOTATION: _format(credentials.expires_at)},
            "ownerReferences": [
                {"apiVersion": "v1", "kind": "Pod", "name": pod_name, "uid": pod_uid}
            ],
        },
        "data": {
            key: base64.b64encode(value.encode()).decode()
            for key, value in credentials.secret_data().items()
        },
    }


# ------------------------------------------------------------------------------ internals
def _signed_post(
    access: StsAccess,
    path: str,
    body: str,
    *,
    sts: bool,
    timeout: float,
    http: urllib3.PoolManager | None,
) -> urllib3.BaseHTTPResponse:
    """POST ``body`` to ``path`` of the store, signed with the broad key (SigV4 for STS,
    or for S3 and MinIO's admin API)."""
    from minio.credentials.credentials import Credentials
    from minio.helpers import sha256_hash
    from minio.signer import sign_v4_s3, sign_v4_sts
    from minio.time import to_amz_date

    url = urlsplit(access.endpoint_url + path)
    now = datetime.now(UTC)
    headers: dict[str, str | list[str] | tuple[str]] = {
        "Host": url.netloc,
        "X-Amz-Date": to_amz_date(now),
    }
    if body:
        headers["Content-Type"] = "application/x-www-form-urlencoded"
    content_sha256 = sha256_hash(body)
    if not sts:
        headers["x-amz-content-sha256"] = content_sha256
    signed = (sign_v4_sts if sts else sign_v4_s3)(
        method="POST",
        url=url,
        region=access.region,
        headers=headers,
        credentials=Credentials(access.access_key, access.secret_key),
        content_sha256=content_sha256,
        date=now,
    )
    pool = http or _HTTP
    try:
        return pool.request(
            "POST",
            url.geturl(),
            body=body,
            headers={name: str(value) for name, value in signed.items()},
            timeout=urllib3.Timeout(connect=timeout, read=timeout),
            retries=False,
        )
    except urllib3.exceptions.HTTPError as error:
        raise CredentialsUnavailable(
            f"the store's {'STS' if sts else 'admin API'} at {access.endpoint_url} did not "
            f"answer: {type(error).__name__}"
        ) from None


def _session_name(state_id: str) -> str:
    """AWS's RoleSessionName: 2-64 of ``[\\w+=,.@-]``; it shows in the store's audit log."""
    name = _SESSION_NAME.sub("-", state_id)[:64]
    return name if len(name) >= 2 else f"run-{name}"


def _error_of(body: bytes) -> tuple[str, str]:
    """(Code, Message) of an STS or S3 error document; never any other part of the body."""
    try:
        root = ElementTree.fromstring(body)
    except ElementTree.ParseError:
        return "Unknown", "the answer was not an STS error document"
    code = message = None
    for element in root.iter():
        tag = element.tag.rsplit("}", 1)[-1]
        if tag == "Code" and code is None:
            code = (element.text or "").strip()
        elif tag == "Message" and message is None:
            message = (element.text or "").strip()
    return code or "Unknown", message or ""


def _parse_credentials(body: bytes) -> RunCredentials:
    try:
        root = ElementTree.fromstring(body)
        found = root.find(f".//{_STS_NAMESPACE}Credentials")
        if found is None:
            found = root.find(".//Credentials")
        if found is None:
            raise ValueError("no Credentials element")

        def text(name: str) -> str:
            assert found is not None
            element = found.find(_STS_NAMESPACE + name)
            if element is None:
                element = found.find(name)
            if element is None or not (element.text or "").strip():
                raise ValueError(f"no {name}")
            return (element.text or "").strip()

        expires = datetime.fromisoformat(text("Expiration").replace("Z", "+00:00"))
        return RunCredentials(
            access_key=text("AccessKeyId"),
            secret_key=text("SecretAccessKey"),
            session_token=text("SessionToken"),
            expires_at=expires if expires.tzinfo else expires.replace(tzinfo=UTC),
        )
    except (ElementTree.ParseError, ValueError) as error:
        raise CredentialsRefused(
            200, "Malformed", f"AssumeRole answer unreadable: {error}"
        ) from None


def _format(moment: datetime) -> str:
    return moment.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
