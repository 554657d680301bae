"""Model ids as each provider spells them, brought back to the Anthropic API's own.

Bedrock names a model ``anthropic.claude-sonnet-4-5-20250929-v1:0``, an inference profile
``us.anthropic.claude-...`` (or its ARN); Vertex AI ``claude-sonnet-4-5@20250929``; Azure AI
Foundry takes the Anthropic id (or a deployment named after it). The context-window and
price tables are keyed by the Anthropic id: :func:`anthropic_model_id` is what they look up.
"""

from __future__ import annotations

import re

__all__ = ["anthropic_model_id"]

# [geography.]anthropic.<id>[-vN[:M]]: the geography prefix names a cross-region profile.
_BEDROCK = re.compile(
    r"^(?:[a-z]{2,6}(?:-[a-z]+)?\.)?anthropic\.(?P<id>claude-.+?)(?:-v\d+(?::\d+)?)?$"
)


def anthropic_model_id(model: str) -> str:
    """The Anthropic API's id of ``model`` as Bedrock, Vertex AI or Foundry spell it
    (unchanged when it is one already, or not a Claude id at all)."""
    if model.startswith("arn:"):  # an inference profile's or a provisioned model's ARN
        model = model.rsplit("/", 1)[-1]
    found = _BEDROCK.match(model)
    if found:
        return found.group("id")
    if model.startswith("claude-") and "@" in model:
        name, _, version = model.partition("@")
        return name if version == "default" else f"{name}-{version}"
    return model
