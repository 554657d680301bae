"""Long runs, billed: input tokens in input-price units, ours next to LangChain's (issue 22).

``python benchmarks/long_runs.py`` (from the repository root, the ``bench`` extra
installed) runs the conversation of :mod:`benchmarks.billed_runs` (every turn one tool
call with a 2 KB result, the last turn an answer) at 100, 500 and 2,000 turns through the
billing model server, for each setting: our Agent with its defaults (prompt caching and
compaction on) and with caching off; LangChain's ``create_agent`` with ``ChatAnthropic``
by default, with ``AnthropicPromptCachingMiddleware``, with ``SummarizationMiddleware``
plus caching and with ``ContextEditingMiddleware`` plus caching. Then it kills one of our
runs at turn 60 (SIGKILL, in the middle of that turn's tool call) and resumes it: how much
of the first resumed request's prompt was read from the cache.

It writes ``benchmarks/results/long_runs.md`` and the plot ``docs/long-runs-billing.png``
(``--out`` and ``--plot`` to write elsewhere; ``--quick`` for small sizes). ``python -m
benchmarks long-runs`` puts the same section in a results page.
"""

from __future__ import annotations

import argparse
import os
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
if str(REPO) not in sys.path[:2]:
    sys.path[:0] = [str(REPO / "operator"), str(REPO)]

from alpineagents import FileStore  # noqa: E402
from benchmarks.billed_runs import (  # noqa: E402
    EDIT_TRIGGER,
    LANGCHAIN,
    LANGCHAIN_CACHE,
    LANGCHAIN_SUMMARY,
    OURS,
    OURS_SMALL,
    SETTINGS,
    SUMMARY_TRIGGER,
    BilledRun,
    billing_server,
)
from benchmarks.measure import load_average, machine, versions  # noqa: E402
from benchmarks.results_page import Page, Row, table  # noqa: E402
from benchmarks.sizes import LongRunSizes  # noqa: E402

RESULTS = REPO / "benchmarks" / "results" / "long_runs.md"
PLOT = LongRunSizes().plot
CHILD = REPO / "benchmarks" / "long_run_child.py"
CACHE_TARGET = 0.115  # of the uncached input, at 120 turns
WINDOW_TARGET = 0.15  # past the window
RESUME_TARGET = 0.90  # of the first resumed request's prompt read from the cache
FLAT_SLACK = 1.05  # "stays flat": the longest run's ratio within 5% of the one before


@dataclass
class LongRunFigures:
    """Every run, by length and setting, and the resumed run."""

    sizes: LongRunSizes
    runs: dict[int, dict[str, BilledRun]] = field(default_factory=dict)
    cache_runs: dict[str, BilledRun] = field(default_factory=dict)  # at ``cache_turns``
    resume: BilledRun | None = None
    seconds: float = 0.0

    def longest(self) -> dict[str, BilledRun]:
        """Each setting's longest run (what the plot draws)."""
        out: dict[str, BilledRun] = {}
        for length in sorted(self.runs):
            out.update(self.runs[length])
        return out

    def window_turn(self) -> int | None:
        """The turn at which LangChain's default died at the window (None: it never did)."""
        failed = [
            run.failed_at
            for runs in self.runs.values()
            for name, run in runs.items()
            if name == LANGCHAIN.name and run.failed_at is not None
        ]
        return min(failed) if failed else None


def measure(work: Path, sizes: LongRunSizes) -> LongRunFigures:
    """Every setting at every length (LangChain's up to ``langchain_max``), then the resume."""
    began = time.monotonic()
    figures = LongRunFigures(sizes)
    for length in sizes.lengths:
        figures.runs[length] = {}
        for number, setting in enumerate(SETTINGS):
            if setting.side == "langchain" and length > sizes.langchain_max:
                continue
            _progress(f"{setting.name}, {length} turns")
            folder = work / f"{length}-{number}"
            figures.runs[length][setting.name] = setting.run(length, sizes.window, folder)
    for setting in (OURS, LANGCHAIN_CACHE):
        if sizes.cache_turns in figures.runs:
            figures.cache_runs[setting.name] = figures.runs[sizes.cache_turns][setting.name]
        else:
            _progress(f"{setting.name}, {sizes.cache_turns} turns")
            folder = work / f"cache-{setting.side}"
            run = setting.run(sizes.cache_turns, sizes.window, folder)
            figures.cache_runs[setting.name] = run
    _progress(f"resume at turn {sizes.kill_at}")
    figures.resume = resume(work / "resume", sizes)
    figures.seconds = time.monotonic() - began
    return figures


def _progress(text: str) -> None:
    print(f"[long-runs] {text}", file=sys.stderr, flush=True)


def resume(folder: Path, sizes: LongRunSizes) -> BilledRun:
    """Our run in a process of its own, SIGKILLed in the middle of turn ``kill_at``'s tool
    call, then resumed to the end in a new process; ``read_fraction`` is the share of the
    first resumed request's prompt that was read from the cache."""
    state_id = "resumed"
    command = [sys.executable, str(CHILD), str(folder), state_id, str(sizes.window)]
    began = time.monotonic()
    with billing_server(sizes.resume_turns, sizes.window) as (server, responder):
        env = {**os.environ, "ANTHROPIC_BASE_URL": server.url, "ANTHROPIC_API_KEY": "x"}
        child = subprocess.Popen(
            [*command, "--hang-at", str(sizes.kill_at)],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            env=env,
            text=True,
        )
        try:
            line = child.stdout.readline() if child.stdout else ""
            if line.strip() != f"hanging at {sizes.kill_at}":
                child.wait()
                raise RuntimeError(
                    f"the run to kill ended before turn {sizes.kill_at} (exit "
                    f"{child.returncode}): {child.stderr.read() if child.stderr else ''}"
                )
            os.kill(child.pid, signal.SIGKILL)
        finally:
            child.wait()
            for stream in (child.stdout, child.stderr):
                if stream is not None:
                    stream.close()
        killed = FileStore(folder).load(state_id)
        replies_before = sum(1 for e in killed.history if e.kind == "model_reply")
        subprocess.run(command, env=env, check=True, capture_output=True)
        bill = server.bill
        run = BilledRun(
            "ours: killed and resumed",
            sizes.resume_turns,
            sizes.window,
            None,
            bill.input_units,
            bill.uncached_units,
            bill.largest_prompt,
            bill.requests,
            responder.summaries,
            time.monotonic() - began,
            responder.curve,
        )
    replies = [e for e in FileStore(folder).load(state_id).history if e.kind == "model_reply"]
    usage = replies[replies_before].data.get("usage", {})
    prompt = sum(
        usage.get(k, 0)
        for k in ("input_tokens", "cache_creation_input_tokens", "cache_read_input_tokens")
    )
    run.read_fraction = usage.get("cache_read_input_tokens", 0) / prompt if prompt else 0.0
    return run


# ---------------------------------------------------------------------------- the page


def _units(value: float) -> str:
    return f"{value / 1e6:,.2f}M" if value >= 1e6 else f"{value / 1e3:,.1f}k"


def _run_row(run: BilledRun) -> list[str]:
    return [
        run.setting,
        _units(run.input_units),
        _units(run.uncached_units),
        f"{run.ratio:.3f}",
        f"{run.largest_prompt:,}",
        f"{run.requests:,}",
        run.outcome,
        f"{run.seconds:.0f} s",
    ]


_HEAD = [
    "setting",
    "billed input units",
    "uncached units",
    "ratio",
    "largest prompt (tokens)",
    "requests",
    "outcome",
    "time",
]


def targets(figures: LongRunFigures) -> dict[str, Row]:
    """Issue 22's targets for long runs, judged on these figures."""
    sizes = figures.sizes
    rows: dict[str, Row] = {}
    ours_cache = figures.cache_runs[OURS.name]
    theirs_cache = figures.cache_runs[LANGCHAIN_CACHE.name]
    rows["long-cache"] = Row(
        f"{sizes.cache_turns}-turn run, 2 KB tool results: billed input / uncached input",
        f"ours {ours_cache.ratio:.3f}; LangChain + prompt caching {theirs_cache.ratio:.3f}",
        f"at most {CACHE_TARGET}",
        ours_cache.ratio <= CACHE_TARGET,
    )
    lengths = sorted(figures.runs)
    ours = [figures.runs[n][OURS.name] for n in lengths]
    rows["long-flat"] = Row(
        "our billed/uncached ratio as runs grow",
        ", ".join(
            f"{r.ratio:.3f} at {n:,}" + ("" if r.failed_at is None else f" ({r.outcome})")
            for n, r in zip(lengths, ours, strict=True)
        ),
        "the longest run's ratio falls or stays flat (within 5% of the one before)",
        all(r.failed_at is None for r in ours)
        and (len(ours) < 2 or ours[-1].ratio <= ours[-2].ratio * FLAT_SLACK),
    )
    largest = max(
        r.largest_prompt
        for runs in figures.runs.values()
        for r in runs.values()
        if r.setting.startswith("ours")
    )
    finished = all(
        r.failed_at is None
        for runs in figures.runs.values()
        for r in runs.values()
        if r.setting.startswith("ours")
    )
    rows["long-largest"] = Row(
        "our largest request, every length and setting",
        f"{largest:,} tokens (window {sizes.window:,}); "
        + ("every run finished" if finished else "a run failed"),
        "never past the window; every run finishes",
        largest <= sizes.window and finished,
    )
    rows["long-window"] = _window_row(figures)
    run = figures.resume
    assert run is not None and run.read_fraction is not None
    rows["long-resume"] = Row(
        f"killed at turn {sizes.kill_at} (SIGKILL mid-tool) and resumed: the first resumed "
        "request's prompt read from the cache",
        f"{run.read_fraction:.1%}",
        f"at least {RESUME_TARGET:.0%}",
        run.read_fraction >= RESUME_TARGET,
    )
    return rows


def _window_row(figures: LongRunFigures) -> Row:
    turn = figures.window_turn()
    past = [n for n in sorted(figures.runs) if turn is not None and n >= turn]
    if not past:
        return Row("past the window", "-", "", None)
    parts, met = [], True
    for length in past:
        runs = figures.runs[length]
        ours, same = runs[OURS.name], runs.get(OURS_SMALL.name)
        theirs = [
            r for r in runs.values() if r.setting.startswith("LangChain") and r.failed_at is None
        ]
        best = min(theirs, key=lambda r: r.input_units) if theirs else None
        text = f"{length:,} turns: ours (defaults) {_units(ours.input_units)} ({ours.ratio:.3f}"
        text += ")" if ours.failed_at is None else f", {ours.outcome})"
        if same is not None:
            text += f", ours at LangChain's context {_units(same.input_units)} ({same.ratio:.3f})"
            met = met and same.ratio <= WINDOW_TARGET and same.failed_at is None
        if best is not None:
            text += f", LangChain's best finishing ({best.setting}) {_units(best.input_units)}"
            compared = same if same is not None else ours
            met = met and compared.input_units <= best.input_units
        met = met and ours.ratio <= WINDOW_TARGET and ours.failed_at is None
        parts.append(text)
    return Row(
        f"past the window (LangChain's default dies at turn {turn:,}): billed input units",
        "; ".join(parts),
        f"at most {WINDOW_TARGET} of our uncached input, and, at the same context kept, no more "
        "than LangChain's best finishing setting",
        met,
    )


def peer_notes(figures: LongRunFigures) -> list[str]:
    """Where LangChain bills less than ours, or its figure flatters it."""
    notes = []
    turn = figures.window_turn()
    for length, runs in sorted(figures.runs.items()):
        summary = runs.get(LANGCHAIN_SUMMARY.name)
        past = turn is not None and length >= turn
        if past and summary is not None and summary.summaries == 0:
            notes.append(
                f"At {length:,} turns LangChain's SummarizationMiddleware never asked the "
                "model for a summary: it trims what it summarizes to the last 4,000 tokens "
                "starting at a human message, and a tool loop has none there, so its summary "
                'is the fixed text "Previous conversation was too long to summarize.": it '
                "drops the older turns outright, which is part of why it bills little. Ours "
                "clears old tool results from the request first, and asks the model for a "
                "summary when that is not enough."
            )
            break
    for length, runs in sorted(figures.runs.items()):
        ours = runs[OURS.name]
        cheaper = [
            run
            for run in runs.values()
            if run.setting.startswith("LangChain")
            and run.failed_at is None
            and run.input_units < ours.input_units
        ]
        for run in cheaper:
            notes.append(
                f"{length:,} turns: {run.setting} billed {_units(run.input_units)}, "
                f"ours {_units(ours.input_units)}"
                + (" (past the window)" if turn is not None and length >= turn else "")
                + "."
            )
    return notes


def section_lines(figures: LongRunFigures, plot: str | None) -> list[str]:
    """The section's Markdown: a table per length, the resume, how it was measured."""
    sizes = figures.sizes
    lines = ["## Long runs, billed (issue 22)", ""]
    if plot is not None:
        lines += [f"![Billed input units against turns, every setting]({plot})", ""]
    if sizes.cache_turns not in figures.runs:
        cache = [_run_row(r) for r in figures.cache_runs.values()]
        lines += [f"### {sizes.cache_turns} turns (the caching target)", "", *table(_HEAD, cache)]
    for length in sorted(figures.runs):
        rows = [_run_row(r) for r in figures.runs[length].values()]
        lines += ["", f"### {length:,} turns", "", *table(_HEAD, rows)]
    run = figures.resume
    assert run is not None and run.read_fraction is not None
    lines += [
        "",
        "### A resume",
        "",
        f"Our run (defaults, FileStore) in a process of its own, SIGKILLed in the middle of "
        f"turn {sizes.kill_at}'s tool call, then resumed by a new process to the end of its "
        f"{sizes.resume_turns} turns: the first resumed request read "
        f"**{run.read_fraction:.1%}** of its prompt from the cache; the whole run billed "
        f"{_units(run.input_units)} units of {_units(run.uncached_units)} uncached "
        f"({run.ratio:.3f}).",
        "",
        "### How it was measured",
        "",
        "Each run has its own `alpineagents.testing.ModelServer` with billing on: it counts "
        "a prompt as about 4 characters of its JSON a token, honours `cache_control` as the "
        "API does (prefix match, 20-block lookback, 1,024-token minimum, TTLs) and refuses "
        f'a prompt past {sizes.window:,} tokens with the API\'s 400 "prompt is too long". '
        "Billed input units: uncached input 1, cache writes 1.25 (5 minutes), cache reads "
        "0.1; uncached units are the same prompts at full price, so the ratio is the share "
        "of the uncached price paid. Every turn calls `check_service`, whose result is "
        "2,048 bytes of log text; the last turn answers. The model is a pure function of "
        "the request (`benchmarks/billed_runs.py`): the turn comes from the newest tool "
        "result's id, and a request without tools or whose last user message asks for a "
        "summary gets a summary, so both sides' compaction calls are answered alike.",
        "",
        "Ours: `Agent(model, FileStore(...), tools=..., system=..., "
        f"context_window={sizes.window})`, everything else default; the uncached "
        "baseline adds `prompt_cache=None` (compaction stays on). LangChain: "
        "`create_agent(ChatAnthropic(...), tools, system_prompt, middleware)`; "
        '`AnthropicPromptCachingMiddleware(ttl="5m")`; `SummarizationMiddleware(model, '
        f'trigger=("tokens", {int(sizes.window * SUMMARY_TRIGGER)}))` (its defaults '
        "otherwise: keep 20 messages, approximate token counting); "
        "`ContextEditingMiddleware(edits=[ClearToolUsesEdit(trigger="
        f"{int(sizes.window * EDIT_TRIGGER)})])` (its default trigger, 100k tokens of a "
        "200k window; it clears all but the 3 newest tool results from the request). A run "
        "the API refuses is recorded as failed at that turn.",
        "",
    ]
    if sizes.langchain_max < max(sizes.lengths):
        lines += [
            f"LangChain runs up to {sizes.langchain_max:,} turns only: its turns cost "
            "hundreds of milliseconds of Python near the window on this machine "
            "(`ClearToolUsesEdit` alone took 200 s for 500 turns), so 2,000 turns of its two "
            "settings that finish would take most of an hour. Its default and caching "
            "settings die at the window whatever the length past it.",
            "",
        ]
    lines += [
        "The billing is deterministic, so each run ran once; times are wall time on a "
        f"shared machine. The whole section took {figures.seconds / 60:.1f} min.",
    ]
    return lines


def plot(figures: LongRunFigures, path: Path) -> None:
    """Billed input units against turns, each setting's longest run; a cross where one died."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(9, 5.5), dpi=120)
    for run in figures.longest().values():
        points = [(t, units) for t, units, _ in run.curve if units > 0]  # log scale
        turns = [t for t, _ in points]
        billed = [units / 1e6 for _, units in points]
        style = "-" if run.setting.startswith("ours") else "--"
        ended = "finished" if run.failed_at is None else f"failed at turn {run.failed_at:,}"
        (line,) = ax.plot(turns, billed, style, label=f"{run.setting} ({ended})")
        if run.failed_at is not None:
            ax.plot(turns[-1:], billed[-1:], "x", color=line.get_color(), markersize=10)
    ax.set_yscale("log")
    ax.set_xlabel("turns (each one tool call with a 2 KB result)")
    ax.set_ylabel("billed input, millions of input-price units")
    ax.set_title(f"Long runs through the billing server ({figures.sizes.window:,}-token window)")
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path)
    plt.close(fig)


def section(page: Page, work: Path, sizes: LongRunSizes) -> None:
    """The section ``long-runs`` of ``python -m benchmarks``: its targets and its tables.

    The billing is deterministic, so each run runs once whatever the pass's repeats."""
    figures = measure(work, sizes)
    picture = None
    if sizes.plot is not None:
        plot(figures, sizes.plot)
        picture = os.path.relpath(sizes.plot, REPO / "benchmarks")
    for key, row in targets(figures).items():
        row.samples = "one run per setting (the billing is deterministic)"
        page.rows[key] = row
    page.sections.append(section_lines(figures, picture))
    page.peer_wins.extend(peer_notes(figures))


def write(figures: LongRunFigures, out: Path, plot_path: Path | None) -> None:
    """The standalone page: header, targets, the section."""
    picture = None
    if plot_path is not None:
        plot(figures, plot_path)
        picture = os.path.relpath(plot_path, out.parent)
    rows, notes = targets(figures), peer_notes(figures)
    lines = [
        "# Long runs, billed: ours and LangChain's",
        "",
        f"Written by `python benchmarks/long_runs.py` on {time.strftime('%Y-%m-%d')} in "
        f"{figures.seconds / 60:.1f} min. Machine: {machine()}; load average "
        f"{load_average()} at the end. Versions: {versions()}.",
        "",
        "## Targets",
        "",
        "| what | measured | goal | |",
        "|---|---|---|---|",
        *(f"| {r.what} | {r.measured} | {r.goal} | {r.verdict} |" for r in rows.values()),
        "",
        *(["## Where LangChain wins or the comparison flatters it", ""] if notes else []),
        *(f"- {note}" for note in notes),
        *([""] if notes else []),
        *section_lines(figures, picture)[2:],
    ]
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text("\n".join(lines).rstrip() + "\n", encoding="utf-8")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--out", type=Path, default=RESULTS, help="where to write the page")
    parser.add_argument("--plot", type=Path, default=None, help=f"the PNG ({PLOT} by default)")
    parser.add_argument("--quick", action="store_true", help="small sizes, to check the harness")
    args = parser.parse_args(argv)
    sizes = LongRunSizes.quick() if args.quick else LongRunSizes()
    if args.quick and (args.out == RESULTS or args.plot == PLOT):
        parser.error("--quick writes a partial page: give --out (and --plot) elsewhere")
    plot_path = args.plot or (None if args.quick else PLOT)
    with tempfile.TemporaryDirectory(prefix="alpineagents-long-runs-") as folder:
        figures = measure(Path(folder), sizes)
    write(figures, args.out, plot_path)
    print(f"[long-runs] wrote {args.out}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
