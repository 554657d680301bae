"""``alpineagents ui``: its options, and serving the viewer until Ctrl+C."""

from __future__ import annotations

import argparse
import ipaddress
import os
import secrets
import socket
import sys
from typing import TYPE_CHECKING, TextIO

from alpineagents import Store

if TYPE_CHECKING:
    from .cluster import Cluster

DEFAULT_PORT = 8765
LOOPBACK_HOSTS = ("127.0.0.1", "localhost", "::1", "[::1]")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The options of ``alpineagents ui`` (``--store`` comes from the common ones)."""
    parser.add_argument(
        "--port",
        type=int,
        default=DEFAULT_PORT,
        help=f"port to serve on (default {DEFAULT_PORT}; 0: any free one)",
    )
    parser.add_argument(
        "--host",
        default="127.0.0.1",
        help="address to serve on (default 127.0.0.1: only this machine; in a pod 0.0.0.0)",
    )
    parser.add_argument(
        "--allow-approvals",
        action="store_true",
        help="let the page answer tool calls that wait for approval (default: read-only); "
        "the address printed holds a token the page must send",
    )
    parser.add_argument(
        "--allow-remote-approvals",
        action="store_true",
        help="with --allow-approvals and a --host other machines reach: let them answer too",
    )
    cluster = parser.add_mutually_exclusive_group()
    cluster.add_argument(
        "--context",
        metavar="NAME",
        help="kubeconfig context for AgentRuns (default: the current one)",
    )
    cluster.add_argument(
        "--no-cluster", action="store_true", help="show the store only, not AgentRuns"
    )
    cluster.add_argument(
        "--in-cluster",
        action="store_true",
        help="in a pod: AgentRuns as the pod's ServiceAccount sees them (the chart's viewer)",
    )
    parser.add_argument(
        "--trace-url",
        metavar="TEMPLATE",
        default=os.environ.get("ALPINEAGENTS_TRACE_URL") or None,
        help="link each run to its trace in your tracing UI: its address with {trace_id} "
        "for the trace's id, e.g. http://localhost:16686/trace/{trace_id} (Jaeger; "
        "default: $ALPINEAGENTS_TRACE_URL)",
    )
    parser.add_argument(
        "--kubeconfig",
        metavar="PATH",
        help="kubeconfig file (default: $KUBECONFIG, else ~/.kube/config)",
    )
    parser.add_argument(
        "-n",
        "--namespace",
        action="append",
        default=[],
        help="only AgentRuns in this namespace; again for more (default: all you may list)",
    )


class UsageError(Exception):
    """Options the viewer cannot start with; the message says what to do."""


def serve(args: argparse.Namespace, store: Store, *, out: TextIO = sys.stdout) -> int:
    """Serve the viewer for ``store`` as ``args`` say, until Ctrl+C or SIGTERM."""
    try:
        import uvicorn

        from .web import create_app
    except ImportError as error:
        raise UsageError(
            f"the viewer needs the ui extra ({error.name} is missing): "
            f"pip install 'alpineagents[ui]'"
        ) from None
    from .service import RunViewer

    loopback = _is_loopback(args.host)
    if args.allow_approvals and not loopback and not args.allow_remote_approvals:
        raise UsageError(
            f"--allow-approvals with --host {args.host} lets other machines answer tool "
            f"calls: add --allow-remote-approvals if that is meant, or serve on 127.0.0.1"
        )
    if args.trace_url and "{trace_id}" not in args.trace_url:
        raise UsageError(
            f"--trace-url {args.trace_url!r} has no {{trace_id}} where the trace's id goes, "
            f"e.g. http://localhost:16686/trace/{{trace_id}}"
        )
    cluster = None if args.no_cluster else _cluster(args)
    viewer = RunViewer(
        store, cluster=cluster, allow_approvals=args.allow_approvals, trace_url=args.trace_url
    )
    hosts = ["127.0.0.1", "localhost", "[::1]", "::1"] if loopback else ["*"]
    # As Jupyter does: only whoever sees the address printed here can answer calls.
    token = secrets.token_urlsafe(24) if args.allow_approvals else None
    app = create_app(viewer, allowed_hosts=hosts, approval_token=token)
    listener = _listen(args.host, args.port)
    port = listener.getsockname()[1]
    shown = f"[{args.host}]" if ":" in args.host else args.host
    mode = "answers approvals" if args.allow_approvals else "read-only"
    where = f"; AgentRuns of {cluster.where}" if cluster else ""
    print(f"http://{shown}:{port}/" + (f"?token={token}" if token else ""), file=out, flush=True)
    print(f"alpineagents ui: {store!r}{where}; {mode}; Ctrl+C stops", file=sys.stderr, flush=True)
    if not loopback:
        # Read-only is not private: every run's whole history, tool results included.
        reach = f"anyone who can reach {args.host}:{port}"
        print(
            f"alpineagents ui: warning: {reach} can read every run's history in {store!r}"
            + (", and with the token answer tool calls" if args.allow_approvals else "")
            + "; the connection is not encrypted",
            file=sys.stderr,
            flush=True,
        )
    config = uvicorn.Config(app, log_level="warning", timeout_graceful_shutdown=1, lifespan="off")
    try:
        uvicorn.Server(config).run(sockets=[listener])
    finally:
        listener.close()
        if cluster is not None:
            cluster.close()
    return 0


def _cluster(args: argparse.Namespace) -> Cluster | None:
    from .cluster import Cluster, ClusterError

    path = args.kubeconfig or os.environ.get("KUBECONFIG") or os.path.expanduser("~/.kube/config")
    explicit = bool(args.kubeconfig or args.context)
    if not args.in_cluster and not any(os.path.exists(p) for p in path.split(os.pathsep)):
        if explicit:
            raise UsageError(f"kubeconfig {path} does not exist (or start with --no-cluster)")
        return None  # no cluster at hand: the store alone
    try:
        if args.in_cluster:
            return Cluster.in_cluster(args.namespace)
        return Cluster.from_kubeconfig(path, args.context, args.namespace)
    except ImportError:
        raise UsageError(
            "AgentRuns need the kubernetes client: pip install 'alpineagents[operator]' "
            "(or start with --no-cluster)"
        ) from None
    except ClusterError as error:
        raise UsageError(f"{error} (or start with --no-cluster)") from None


def _is_loopback(host: str) -> bool:
    if host in LOOPBACK_HOSTS:
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


def _listen(host: str, port: int) -> socket.socket:
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    listener = socket.socket(family, socket.SOCK_STREAM)
    listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        listener.bind((host.strip("[]"), port))
    except OSError as error:
        listener.close()
        raise UsageError(
            f"cannot serve on {host}:{port}: {error.strerror} (try --port 0)"
        ) from None
    listener.listen(64)
    return listener
