"""``alpineagents pacer``: the shared limiter as a process (a fleet's runs on one machine,
and the chart's pacing Deployment)."""

from __future__ import annotations

import argparse
import asyncio
import signal
import sys

from .limiter import KeyLimits, Limiter
from .service import PacingService

__all__ = ["add_arguments", "serve"]

DEFAULT_PORT = 8470


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The ``pacer`` command's arguments."""
    parser.add_argument("--host", default="127.0.0.1", help="address to listen on")
    parser.add_argument("--port", type=int, default=DEFAULT_PORT, help="0 picks a free port")
    parser.add_argument(
        "--rpm",
        type=int,
        help="each key's requests per minute (default: learned from the answers' headers)",
    )
    parser.add_argument("--itpm", type=int, help="each key's input tokens per minute")
    parser.add_argument("--otpm", type=int, help="each key's output tokens per minute")
    parser.add_argument(
        "--weight",
        action="append",
        default=[],
        metavar="SHARE=W",
        help="a share's weight (its runs' namespace); 1 when not given",
    )
    parser.add_argument(
        "--headroom",
        type=float,
        default=0.95,
        help="fraction of each limit to hand out (default 0.95)",
    )
    parser.add_argument(
        "--burst-seconds", type=float, default=1.0, help="seconds of each limit handed out at once"
    )


def serve(args: argparse.Namespace) -> int:
    """Serve until SIGTERM or SIGINT; the first stdout line is the limiter's URL."""
    weights = {}
    for item in args.weight:
        share, _, weight = str(item).partition("=")
        try:
            weights[share] = float(weight)
        except ValueError:
            raise ValueError(
                f"--weight {item!r}: write it as SHARE=NUMBER, e.g. team-a=2"
            ) from None
    limiter = Limiter(
        KeyLimits(args.rpm, args.itpm, args.otpm),
        weights=weights,
        headroom=args.headroom,
        burst_seconds=args.burst_seconds,
    )
    asyncio.run(_serve(PacingService(limiter), args.host, args.port))
    return 0


async def _serve(service: PacingService, host: str, port: int) -> None:
    server = await service.start(host, port)
    bound = server.sockets[0].getsockname()
    print(f"http://{bound[0]}:{bound[1]}", flush=True)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for signum in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(signum, stop.set)
    await stop.wait()
    server.close()
    await service.aclose()
    print("pacer stopped", file=sys.stderr)
