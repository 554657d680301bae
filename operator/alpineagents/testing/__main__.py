"""``python -m alpineagents.testing serve``: the scripted model server as a process.

The first stdout line is the server's base URL (for ``ANTHROPIC_BASE_URL``). It serves
until SIGTERM or SIGINT; SIGUSR1 releases held turns. One log line per model request
goes to stderr. It bills like the API (prompt caching; ``--no-cache`` for plain usage)
and refuses prompts past ``--window`` tokens (200000 by default; 0 for no limit). With
``--rpm``, ``--itpm`` or ``--otpm`` it rate-limits like the API (requests, input tokens,
output tokens a minute, in buckets of ``--burst-seconds`` of their rate).
"""

from __future__ import annotations

import argparse
import logging
import signal
import sys
import threading
from collections.abc import Sequence
from types import FrameType

from .rate_limits import RateLimits
from .script import Turn, load_script
from .server import ModelServer


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m alpineagents.testing")
    commands = parser.add_subparsers(dest="command", required=True)
    serve = commands.add_parser("serve", help="serve the scripted Messages API")
    serve.add_argument("--host", default="127.0.0.1")
    serve.add_argument("--port", type=int, default=0, help="0 picks a free port")
    serve.add_argument("--script", help="JSON (or YAML) list of turns")
    serve.add_argument(
        "--echo", action="store_true", help="answer with the echo model once the script ends"
    )
    serve.add_argument(
        "--window",
        type=int,
        default=200_000,
        metavar="N",
        help="refuse prompts over N tokens as the API does (default 200000; 0: no limit)",
    )
    serve.add_argument(
        "--no-cache",
        action="store_true",
        help="no prompt caching: usage is just input_tokens and output_tokens",
    )
    for flag, what in (
        ("--rpm", "requests"),
        ("--itpm", "input tokens"),
        ("--otpm", "output tokens"),
    ):
        serve.add_argument(
            flag, type=int, metavar="N", help=f"rate-limit to N {what} a minute, as the API does"
        )
    serve.add_argument(
        "--burst-seconds",
        type=float,
        default=3.0,
        metavar="S",
        help="each rate limit's bucket holds S seconds of its rate (default 3)",
    )
    args = parser.parse_args(argv)
    if args.window < 0:
        parser.error(f"--window must be 0 (no limit) or a number of tokens, got {args.window}")
    if args.script is None and not args.echo:
        parser.error("serve needs --script FILE, --echo, or both")
    limits: RateLimits | None = None
    if (args.rpm, args.itpm, args.otpm) != (None, None, None):
        try:
            limits = RateLimits(args.rpm, args.itpm, args.otpm, args.burst_seconds)
        except ValueError as exc:
            parser.error(str(exc))

    turns: list[Turn] = []
    echo = bool(args.echo)
    if args.script is not None:
        try:
            turns, file_echo = load_script(args.script)
        except (OSError, ValueError) as exc:
            parser.error(f"cannot read script {args.script}: {exc}")
        echo = echo or file_echo

    logging.basicConfig(level=logging.INFO, stream=sys.stderr, format="%(message)s")
    stop = threading.Event()

    def on_stop(signum: int, frame: FrameType | None) -> None:
        stop.set()

    with ModelServer(
        turns,
        echo=echo,
        window=args.window or None,
        billing=not args.no_cache,
        limits=limits,
        host=args.host,
        port=args.port,
    ) as server:

        def on_release(signum: int, frame: FrameType | None) -> None:
            server.release()

        signal.signal(signal.SIGTERM, on_stop)
        signal.signal(signal.SIGINT, on_stop)
        signal.signal(signal.SIGUSR1, on_release)
        print(server.url, flush=True)
        # A timed wait keeps the main thread returning to Python so signal handlers run.
        while not stop.wait(1.0):
            pass
    return 0


if __name__ == "__main__":
    sys.exit(main())
