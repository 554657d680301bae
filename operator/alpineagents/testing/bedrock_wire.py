"""AWS Bedrock's wire over the scripted Messages API, and a local STS to get its keys from.

:class:`BedrockServer` serves ``POST /model/{modelId}/invoke`` and
``/invoke-with-response-stream`` (the reply as AWS event-stream frames, each a ``chunk``
whose ``bytes`` hold one Messages API event) and verifies every request's SigV4 signature
with botocore, recomputed over the request as received with the secret key the
:class:`LocalSTS` handed out: a wrong signature, an unknown key or session token is
refused 403 as Bedrock does. Refusals for capacity go back as Bedrock's
(``ThrottlingException`` 429, ``ServiceUnavailableException`` 503).

:class:`LocalSTS` answers ``AssumeRoleWithWebIdentity`` (the exchange IRSA makes: the
pod's projected token for a role's temporary keys) when the token is the one it expects;
point the AWS SDK at it with ``AWS_ENDPOINT_URL_STS`` (:meth:`LocalSTS.env`).
"""

from __future__ import annotations

import base64
import binascii
import hmac
import json
import secrets
import struct
import urllib.parse
from collections.abc import Mapping
from datetime import UTC, datetime, timedelta
from typing import Any

from .provider_wire import ProviderRequest, ProviderServer, _Handler

__all__ = ["BedrockServer", "LocalSTS", "event_stream_frame"]

_STS_XML = """<AssumeRoleWithWebIdentityResponse xmlns="https://sts.amazonaws.com/doc/2011-06-15/">
  <AssumeRoleWithWebIdentityResult>
    <SubjectFromWebIdentityToken>system:serviceaccount:runs:alpineagents-run</SubjectFromWebIdentityToken>
    <Audience>sts.amazonaws.com</Audience>
    <AssumedRoleUser>
      <Arn>{role}/{session}</Arn>
      <AssumedRoleId>AROALOCALSTS:{session}</AssumedRoleId>
    </AssumedRoleUser>
    <Credentials>
      <SessionToken>{token}</SessionToken>
      <SecretAccessKey>{secret}</SecretAccessKey>
      <Expiration>{expires}</Expiration>
      <AccessKeyId>{key}</AccessKeyId>
    </Credentials>
    <Provider>oidc.eks.local</Provider>
  </AssumeRoleWithWebIdentityResult>
  <ResponseMetadata><RequestId>{request}</RequestId></ResponseMetadata>
</AssumeRoleWithWebIdentityResponse>
"""


class LocalSTS(ProviderServer):
    """STS's ``AssumeRoleWithWebIdentity`` on loopback: temporary keys for ``role_arn``
    to whoever shows ``web_identity_token``. :attr:`issued` maps each access key id to
    its ``(secret key, session token)``."""

    name = "sts"

    def __init__(self, role_arn: str, web_identity_token: str, *, host: str = "127.0.0.1") -> None:
        super().__init__(None, host=host)  # no model behind it
        self.role_arn = role_arn
        self.web_identity_token = web_identity_token
        self.issued: dict[str, tuple[str, str]] = {}
        self.exchanges = 0

    def env(self, token_file: str) -> dict[str, str]:
        """The variables IRSA sets in a pod (and the endpoint of this STS)."""
        return {
            "AWS_ROLE_ARN": self.role_arn,
            "AWS_WEB_IDENTITY_TOKEN_FILE": token_file,
            "AWS_ROLE_SESSION_NAME": "alpineagents-run",
            "AWS_ENDPOINT_URL_STS": self.url,
        }

    def accepts(self, web_identity_token: str) -> bool:
        """Whether ``web_identity_token`` is the pod's (here: the one given; a subclass may
        ask the cluster's issuer, as STS checks a token against the cluster's OIDC
        provider)."""
        return hmac.compare_digest(web_identity_token, self.web_identity_token)

    def handle(self, request: ProviderRequest, answer: _Handler) -> None:
        form = dict(urllib.parse.parse_qsl(request.body.decode() or request.query))
        if form.get("Action") != "AssumeRoleWithWebIdentity":
            answer.send_body(400, _sts_error("InvalidAction", "not served"), "text/xml")
            return
        if form.get("RoleArn") != self.role_arn or not self.accepts(
            form.get("WebIdentityToken", "")
        ):
            self.refuse("sts: wrong role or web identity token")
            answer.send_body(
                403,
                _sts_error(
                    "AccessDenied", "Not authorized to perform sts:AssumeRoleWithWebIdentity"
                ),
                "text/xml",
            )
            return
        key = "ASIA" + secrets.token_hex(8).upper()
        secret, token = secrets.token_urlsafe(30), secrets.token_urlsafe(60)
        with self._lock:
            self.issued[key] = (secret, token)
            self.exchanges += 1
        expires = (datetime.now(UTC) + timedelta(hours=1)).strftime("%Y-%m-%dT%H:%M:%SZ")
        xml = _STS_XML.format(
            role=self.role_arn.replace(":role/", ":assumed-role/").replace(":iam:", ":sts:"),
            session=form.get("RoleSessionName", "session"),
            token=token,
            secret=secret,
            expires=expires,
            key=key,
            request=secrets.token_hex(16),
        )
        answer.send_body(200, xml.encode(), "text/xml")


class BedrockServer(ProviderServer):
    """Bedrock Runtime's ``InvokeModel`` and ``InvokeModelWithResponseStream`` for Claude,
    SigV4-verified against the keys ``sts`` issued, answered by ``model``."""

    name = "bedrock"

    def __init__(self, model: Any, sts: LocalSTS, region: str, *, host: str = "127.0.0.1") -> None:
        super().__init__(model, host=host)
        self.sts = sts
        self.region = region
        self.model_ids: list[str] = []
        """The model id of each request (as the path named it)."""

    def handle(self, request: ProviderRequest, answer: _Handler) -> None:
        parts = request.path.split("/")
        if request.method != "POST" or len(parts) != 4 or parts[1] != "model":
            answer.send_json(404, {"message": f"{request.method} {request.path} is not served"})
            return
        model_id, operation = urllib.parse.unquote(parts[2]), parts[3]
        if operation not in ("invoke", "invoke-with-response-stream"):
            answer.send_json(404, {"message": f"unknown operation {operation}"})
            return
        problem = self._signature_problem(request)
        if problem is not None:
            self.refuse(f"bedrock: {problem}")
            answer.send_json(
                403, {"message": problem}, {"x-amzn-errortype": "AccessDeniedException"}
            )
            return
        body = request.json()
        if not isinstance(body, dict) or "anthropic_version" not in body or "model" in body:
            answer.send_json(
                400,
                {
                    "message": "Malformed input request: anthropic_version required, model not allowed"
                },
                {"x-amzn-errortype": "ValidationException"},
            )
            return
        with self._lock:
            self.model_ids.append(model_id)
        forwarded = {k: v for k, v in body.items() if k != "anthropic_version"}
        forwarded["model"] = model_id
        stream = operation == "invoke-with-response-stream"
        if stream:
            forwarded["stream"] = True
        upstream = self.forward(forwarded)
        if upstream.status != 200:
            _send_bedrock_error(answer, upstream.status, upstream.body(), upstream.headers)
        elif not stream:
            answer.send_body(200, upstream.body(), headers=_request_id())
        else:
            self._stream(answer, upstream)

    def _stream(self, answer: _Handler, upstream: Any) -> None:
        answer.start_chunks("application/vnd.amazon.eventstream", _request_id())
        try:
            for event, data in upstream.events():
                if event == "error":
                    detail = json.loads(data).get("error", {})
                    kind = _EXCEPTIONS.get(detail.get("type"), "internalServerException")
                    answer.chunk(
                        event_stream_frame(
                            {
                                ":message-type": "exception",
                                ":exception-type": kind,
                                ":content-type": "application/json",
                            },
                            json.dumps({"message": detail.get("message", "")}).encode(),
                        )
                    )
                    continue
                payload = json.dumps({"bytes": base64.b64encode(data).decode()}).encode()
                answer.chunk(
                    event_stream_frame(
                        {
                            ":message-type": "event",
                            ":event-type": "chunk",
                            ":content-type": "application/json",
                        },
                        payload,
                    )
                )
        except OSError:  # http.client's IncompleteRead too: the upstream dropped it
            answer.drop()
            return
        answer.end_chunks()

    def _signature_problem(self, request: ProviderRequest) -> str | None:
        from botocore.auth import SigV4Auth
        from botocore.awsrequest import AWSRequest
        from botocore.credentials import Credentials

        authorization = request.headers.get("authorization", "")
        if not authorization.startswith("AWS4-HMAC-SHA256 "):
            return "Missing Authentication Token (no SigV4 signature)"
        fields = dict(
            item.strip().split("=", 1) for item in authorization[17:].split(",") if "=" in item
        )
        scope = fields.get("Credential", "").split("/")
        if len(scope) != 5 or scope[2] != self.region or scope[3] != "bedrock":
            return f"credential scope {'/'.join(scope[1:])} is not {self.region}/bedrock"
        issued = self.sts.issued.get(scope[0])
        if issued is None:
            return "The security token included in the request is invalid (unknown key)"
        secret, token = issued
        if not hmac.compare_digest(request.headers.get("x-amz-security-token", ""), token):
            return "The security token included in the request is invalid"
        signed = fields.get("SignedHeaders", "").split(";")
        headers = {name: request.headers[name] for name in signed if name in request.headers}
        url = f"http://{request.host}{request.path}" + (
            f"?{request.query}" if request.query else ""
        )
        rebuilt = AWSRequest(method=request.method, url=url, headers=headers, data=request.body)
        rebuilt.context["timestamp"] = request.headers.get("x-amz-date", "")
        signer = SigV4Auth(Credentials(scope[0], secret, token), "bedrock", self.region)
        canonical = signer.canonical_request(rebuilt)
        expected = signer.signature(signer.string_to_sign(rebuilt, canonical), rebuilt)
        if not hmac.compare_digest(expected, fields.get("Signature", "")):
            return "The request signature we calculated does not match the signature you provided"
        return None


# The Messages API's error types as Bedrock names them (status, x-amzn-errortype).
_ERRORS: Mapping[int, tuple[int, str]] = {
    429: (429, "ThrottlingException"),
    529: (503, "ServiceUnavailableException"),
    500: (500, "InternalServerException"),
    400: (400, "ValidationException"),
}
_EXCEPTIONS = {
    "rate_limit_error": "throttlingException",
    "overloaded_error": "serviceUnavailableException",
    "api_error": "internalServerException",
}


def _send_bedrock_error(
    answer: _Handler, status: int, body: bytes, headers: Mapping[str, str]
) -> None:
    try:
        message = json.loads(body).get("error", {}).get("message", "")
    except ValueError:
        message = body.decode(errors="replace")
    code, kind = _ERRORS.get(status, (status, "InternalServerException"))
    # Bedrock sends no anthropic-ratelimit-* headers and no retry-after: its throttling
    # says only that it throttles.
    answer.send_json(code, {"message": message}, {"x-amzn-errortype": kind, **_request_id()})


def _request_id() -> dict[str, str]:
    return {"x-amzn-requestid": secrets.token_hex(16)}


def _sts_error(code: str, message: str) -> bytes:
    return (
        f'<ErrorResponse xmlns="https://sts.amazonaws.com/doc/2011-06-15/"><Error>'
        f"<Type>Sender</Type><Code>{code}</Code><Message>{message}</Message></Error>"
        f"<RequestId>{secrets.token_hex(16)}</RequestId></ErrorResponse>"
    ).encode()


def event_stream_frame(headers: Mapping[str, str], payload: bytes) -> bytes:
    """One message of AWS's event-stream framing (``application/vnd.amazon.eventstream``):
    prelude (total and headers length, CRC), string headers, payload, message CRC."""
    encoded = b""
    for name, value in headers.items():
        raw_name, raw_value = name.encode(), value.encode()
        encoded += struct.pack("!B", len(raw_name)) + raw_name
        encoded += struct.pack("!BH", 7, len(raw_value)) + raw_value  # 7: a string value
    total = 12 + len(encoded) + len(payload) + 4
    prelude = struct.pack("!II", total, len(encoded))
    prelude += struct.pack("!I", binascii.crc32(prelude) & 0xFFFFFFFF)
    message = prelude + encoded + payload
    return message + struct.pack("!I", binascii.crc32(message) & 0xFFFFFFFF)
