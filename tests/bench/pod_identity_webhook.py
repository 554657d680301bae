"""EKS's IAM roles for service accounts (IRSA) on the bench's real node.

On EKS, the pod identity webhook gives a pod whose ServiceAccount is annotated with an IAM
role a projected ServiceAccount token (audience ``sts.amazonaws.com``) and the variables
the AWS SDK reads (``AWS_ROLE_ARN``, ``AWS_WEB_IDENTITY_TOKEN_FILE``); STS then exchanges
that token for the role's temporary keys after checking it with the cluster's issuer.
:class:`PodIdentityWebhook` is that webhook for the bench's kube-apiserver (a real
mutating admission webhook over HTTPS), and :class:`ClusterSTS` a
:class:`~alpineagents.testing.bedrock_wire.LocalSTS` that checks the token with the
cluster's own TokenReview, so a run pod's Bedrock requests go through the same exchange as
on EKS: the kubelet's token, the SDK's exchange, SigV4 with the keys it got.
"""

from __future__ import annotations

import base64
import http.server
import json
import ssl
import threading
from types import TracebackType
from typing import Any, Self

import yaml

from alpineagents.testing.bedrock_wire import LocalSTS
from tests.bench.control_plane import ControlPlane
from tests.bench.infra import free_port

ROLE_ANNOTATION = "eks.amazonaws.com/role-arn"
AUDIENCE = "sts.amazonaws.com"
TOKEN_DIR = "/var/run/secrets/eks.amazonaws.com/serviceaccount"


class ClusterSTS(LocalSTS):
    """A local STS that takes a web-identity token when the cluster's TokenReview says it
    is ``service_account``'s (in ``namespace``) for STS's audience."""

    def __init__(
        self, plane: ControlPlane, role_arn: str, namespace: str, service_account: str, **kw: Any
    ) -> None:
        super().__init__(role_arn, "", **kw)
        self.plane = plane
        self.user = f"system:serviceaccount:{namespace}:{service_account}"
        self.presented: list[str] = []
        """Each web-identity token presented (a credential too: never to be written)."""

    def accepts(self, web_identity_token: str) -> bool:
        with self._lock:
            self.presented.append(web_identity_token)
        review = {
            "apiVersion": "authentication.k8s.io/v1",
            "kind": "TokenReview",
            "spec": {"token": web_identity_token, "audiences": [AUDIENCE]},
        }
        answer = self.plane.kubectl("create", "-f", "-", "-o", "json", input=json.dumps(review))
        status = json.loads(answer.stdout).get("status", {})
        return (
            bool(status.get("authenticated"))
            and status.get("user", {}).get("username") == self.user
        )


class PodIdentityWebhook:
    """The pod identity webhook for pods of ``namespace`` created with ServiceAccount
    ``service_account``, which it gives ``role_arn``; registered while it runs."""

    def __init__(
        self, plane: ControlPlane, namespace: str, service_account: str, role_arn: str
    ) -> None:
        self.plane = plane
        self.namespace = namespace
        self.service_account = service_account
        self.role_arn = role_arn
        self.name = f"bench-pod-identity-{namespace}"
        self.mutated: list[str] = []
        """The pods it gave the role to (generateName or name)."""
        self._server: http.server.ThreadingHTTPServer | None = None

    def __enter__(self) -> Self:
        handler = type("_Handler", (_Handler,), {"webhook": self})
        server = http.server.ThreadingHTTPServer(("127.0.0.1", free_port()), handler)
        pki = self.plane.workdir / "pki"
        context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        # The apiserver's own serving certificate: valid for 127.0.0.1, issued by the CA
        # the webhook configuration names.
        context.load_cert_chain(str(pki / "serving.crt"), str(pki / "serving.key"))
        server.socket = context.wrap_socket(server.socket, server_side=True)
        self._server = server
        threading.Thread(target=server.serve_forever, daemon=True).start()
        self.plane.kubectl("apply", "-f", "-", input=yaml.safe_dump(self._configuration()))
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.plane.kubectl(
            "delete", "mutatingwebhookconfiguration", self.name, "--ignore-not-found", check=False
        )
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()

    def patch(self, pod: dict[str, Any]) -> list[dict[str, Any]]:
        """The JSON patch giving ``pod`` the role, if its ServiceAccount is the one."""
        spec = pod.get("spec", {})
        if spec.get("serviceAccountName") != self.service_account:
            return []
        self.mutated.append(str(pod["metadata"].get("name") or pod["metadata"].get("generateName")))
        volume = {
            "name": "aws-iam-token",
            "projected": {
                "sources": [
                    {
                        "serviceAccountToken": {
                            "audience": AUDIENCE,
                            "expirationSeconds": 86400,
                            "path": "token",
                        }
                    }
                ]
            },
        }
        env = [
            {"name": "AWS_ROLE_ARN", "value": self.role_arn},
            {"name": "AWS_WEB_IDENTITY_TOKEN_FILE", "value": f"{TOKEN_DIR}/token"},
        ]
        mount = {"name": "aws-iam-token", "mountPath": TOKEN_DIR, "readOnly": True}
        ops: list[dict[str, Any]] = []
        ops += _append(spec, "volumes", "/spec/volumes", volume)
        for index, container in enumerate(spec.get("containers", [])):
            where = f"/spec/containers/{index}"
            ops += _append(container, "volumeMounts", f"{where}/volumeMounts", mount)
            for variable in env:
                ops += _append(container, "env", f"{where}/env", variable)
        return ops

    def _configuration(self) -> dict[str, Any]:
        ca = (self.plane.workdir / "pki" / "ca.crt").read_bytes()
        assert self._server is not None
        port = self._server.server_address[1]
        return {
            "apiVersion": "admissionregistration.k8s.io/v1",
            "kind": "MutatingWebhookConfiguration",
            "metadata": {"name": self.name},
            "webhooks": [
                {
                    "name": "pod-identity.bench.alpineagents.dev",
                    "clientConfig": {
                        "url": f"https://127.0.0.1:{port}/mutate",
                        "caBundle": base64.b64encode(ca).decode(),
                    },
                    "rules": [
                        {
                            "operations": ["CREATE"],
                            "apiGroups": [""],
                            "apiVersions": ["v1"],
                            "resources": ["pods"],
                        }
                    ],
                    "namespaceSelector": {
                        "matchLabels": {"kubernetes.io/metadata.name": self.namespace}
                    },
                    "failurePolicy": "Fail",
                    "sideEffects": "None",
                    "admissionReviewVersions": ["v1"],
                    "timeoutSeconds": 10,
                }
            ],
        }


def _append(holder: dict[str, Any], key: str, path: str, value: Any) -> list[dict[str, Any]]:
    """A JSON patch op adding ``value`` to the list ``holder[key]`` (made if missing)."""
    if key not in holder:
        holder[key] = [value]
        return [{"op": "add", "path": path, "value": [value]}]
    holder[key].append(value)
    return [{"op": "add", "path": f"{path}/-", "value": value}]


class _Handler(http.server.BaseHTTPRequestHandler):
    webhook: PodIdentityWebhook

    def log_message(self, format: str, *args: Any) -> None:
        return None

    def do_POST(self) -> None:
        review = json.loads(self.rfile.read(int(self.headers.get("content-length") or 0)))
        request = review.get("request", {})
        response: dict[str, Any] = {"uid": request.get("uid", ""), "allowed": True}
        ops = self.webhook.patch(request.get("object", {}))
        if ops:
            response["patchType"] = "JSONPatch"
            response["patch"] = base64.b64encode(json.dumps(ops).encode()).decode()
        body = json.dumps(
            {"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", "response": response}
        ).encode()
        self.send_response(200)
        self.send_header("content-type", "application/json")
        self.send_header("content-length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)
