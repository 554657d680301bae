"""The credentials a model provider's client holds, including those it obtains while a run
goes on, registered for masking the moment they exist.

A key from a Secret reaches the runner as a variable, so the runner's
:class:`~alpineagents.redaction.Redactor` knows it from the start. A cloud's credentials do
not: Bedrock's temporary AWS keys come from the web-identity exchange the AWS SDK makes at
the first request (and again when they expire), Vertex AI's bearer token from the metadata
server or a service account key's exchange, Foundry's Entra token from its token endpoint
(:mod:`.entra` registers that one itself). :func:`learn_credentials` is called after every
model request (:func:`alpineagents.model.ask`), before anything about its answer or its
error is written, and hands each credential the client holds to
:func:`~alpineagents.redaction.learn`: from then on every log line, saved entry,
termination message and trace attribute of the process masks it.
"""

from __future__ import annotations

import contextlib
from typing import Any

from .redaction import learn

__all__ = ["credentials_of", "learn_credentials"]

# The attributes where the SDK's clients keep a credential: the Anthropic API's and
# Foundry's key or token, AWS keys given to the Bedrock client, Vertex AI's access token.
_CLIENT_ATTRIBUTES = (
    "api_key",
    "auth_token",
    "access_token",
    "aws_access_key",
    "aws_secret_key",
    "aws_session_token",
)


def credentials_of(client: Any) -> list[str]:
    """Every credential ``client`` (an anthropic SDK client) holds now: its key or token,
    Bedrock's AWS keys (given, or the temporary ones the AWS SDK's chain obtained), Vertex
    AI's bearer token (once fetched)."""
    values = [getattr(client, name, None) for name in _CLIENT_ATTRIBUTES]
    values.append(getattr(getattr(client, "credentials", None), "token", None))
    values += _bedrock_chain_keys(client)
    return [value for value in values if isinstance(value, str) and value]


def learn_credentials(client: Any, *also: str) -> None:
    """Mask everything :func:`credentials_of` ``client`` finds (and ``also``) in whatever
    this process writes from now on."""
    for value in [*credentials_of(client), *also]:
        if value:
            learn(value)


def _bedrock_chain_keys(client: Any) -> list[str]:
    """The temporary keys the Bedrock client signs with when it was given none (IRSA's
    web-identity exchange, EKS Pod Identity, an instance role)."""
    if getattr(client, "aws_region", None) is None or getattr(client, "api_key", None):
        return []  # not a Bedrock client, or one on a Bedrock API key (already known)
    if getattr(client, "aws_secret_key", None) is not None:
        return []  # keys given to it: read above
    try:
        from anthropic.lib.aws._auth import _get_session
    except ImportError:  # pragma: no cover - an SDK that signs elsewhere
        return []
    # The SDK keeps one boto3 session per argument set (an lru_cache): the same arguments,
    # in the order it passes them, find that session and its keys, not a new exchange.
    session = _get_session(
        profile=getattr(client, "aws_profile", None),
        region=client.aws_region,
        aws_access_key=None,
        aws_secret_key=None,
        aws_session_token=None,
    )
    with contextlib.suppress(Exception):  # no keys yet (the first request failed before)
        credentials = session.get_credentials()
        if credentials is not None:
            frozen = credentials.get_frozen_credentials()
            return [frozen.access_key, frozen.secret_key, frozen.token]
    return []
