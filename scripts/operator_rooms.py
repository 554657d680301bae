"""How many rooms a change of the operator touches, under the two layouts of
docs/architecture.md: ``python scripts/operator_rooms.py``.

Every commit that changed a module of ``operator/alpineagents_operator/`` counts once: the
rooms its modules fall in under each layout (modules since renamed under their new names),
the lines of those rooms (what a change makes a reader open), and whether any two rooms
import each other (then the rooms cannot be layers).
"""

from __future__ import annotations

import itertools
import statistics
import subprocess
from pathlib import Path

import grimp

PACKAGE = "alpineagents_operator"
ROOT = Path(__file__).resolve().parents[1]
RENAMED = {"reconcile": "reconciler", "store_view": "saved_state"}

BY_JOB = {  # layout 1: each job a room, the rooms in floors (pyproject's contracts)
    "edge": "__main__ handlers leadership lease_holder",
    "reconciling": "reconciler actions places forks throttling notifier retention "
    "schedule_keeper kueue_admission",
    "watching": "watched triage resumes refusals",
    "warm_pool": "standby_pool handover",
    "credentials": "store_policy run_credentials credential_issuer run_stores saved_state",
    "deciding": "decide step moves pod_losses pod_exits pod_refusals pod_outcomes run_status "
    "notifications schedules cron",
    "kube": "cluster pods views config metrics admission resource_caps __init__ "
    "schedule_api schedule_names kueue_workloads",
}
BY_FEATURE = {  # layout 2: each feature a room, around the reconcile loop
    "operating": "__main__ handlers leadership lease_holder config metrics __init__",
    "runs": "reconciler actions watched triage resumes refusals decide step moves pod_losses "
    "pod_exits pod_refusals pod_outcomes run_status cluster pods views",
    "admission": "admission places resource_caps throttling kueue_admission kueue_workloads",
    "credentials": "store_policy run_credentials credential_issuer run_stores saved_state",
    "warm_pool": "standby_pool handover",
    "forks": "forks",
    "run_ends": "notifications notifier retention",
    "schedules": "schedules cron schedule_keeper schedule_api schedule_names",
}


def _commits() -> list[set[str]]:
    log = subprocess.run(
        ["git", "log", "--format=@%h", "--name-only", "--", f"operator/{PACKAGE}/"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    commits = []
    for chunk in log.split("@")[1:]:
        stems = {Path(p).stem for p in chunk.split()[1:] if p.endswith(".py")}
        if stems:
            commits.append({RENAMED.get(s, s) for s in stems})
    return commits


FOLDER = ROOT / "operator" / PACKAGE
# Each module by its stem, wherever it now lives (the rooms are subpackages since).
FILES = {p.stem: p for p in FOLDER.rglob("*.py") if p.stem != "__init__"} | {
    "__init__": FOLDER / "__init__.py"
}


def _module(stem: str) -> str:
    parts = FILES[stem].relative_to(FOLDER.parent).with_suffix("").parts
    return ".".join(parts[:-1] if stem == "__init__" else parts)


def report(name: str, layout: dict[str, str], commits: list[set[str]]) -> str:
    """One paragraph of numbers for ``layout``."""
    rooms = {room: mods.split() for room, mods in layout.items()}
    room_of = {m: room for room, mods in rooms.items() for m in mods}
    lines = {
        room: sum(len(FILES[m].read_text().splitlines()) for m in mods)
        for room, mods in rooms.items()
    }
    touched = [{room_of[m] for m in mods if m in room_of} for mods in commits]
    touched = [t for t in touched if t]
    counts = [len(t) for t in touched]
    opened = [sum(lines[r] for r in t) for t in touched]
    graph = grimp.build_graph(PACKAGE, exclude_type_checking_imports=True)

    def imports(a: str, b: str) -> bool:
        return any(
            graph.direct_import_exists(importer=_module(x), imported=_module(y))
            for x in rooms[a]
            for y in rooms[b]
        )

    both_ways = [
        (a, b) for a, b in itertools.combinations(rooms, 2) if imports(a, b) and imports(b, a)
    ]
    unplaced = sorted(set(FILES) - set(room_of))
    return (
        f"{name}: {len(rooms)} rooms; over {len(touched)} commits a change touched "
        f"{statistics.mean(counts):.2f} rooms on average (one room: {counts.count(1)}, three "
        f"or more: {sum(c >= 3 for c in counts)}), rooms holding {statistics.mean(opened):.0f} "
        f"lines; the biggest room: {max(lines.values())} lines; rooms importing each other: "
        f"{both_ways or 'none'}; modules in no room: {unplaced or 'none'}"
    )


if __name__ == "__main__":
    history = _commits()
    print(report("layout 1, by job", BY_JOB, history))
    print(report("layout 2, by feature", BY_FEATURE, history))
