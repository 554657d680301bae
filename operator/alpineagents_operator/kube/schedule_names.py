"""An AgentSchedule's names in the API, and what it writes on the runs it creates."""

from __future__ import annotations

from alpineagents_operator.kube.views import GROUP

SCHEDULE_KIND = "AgentSchedule"
SCHEDULE_PLURAL = "agentschedules"
SCHEDULE_LABEL = f"{GROUP}/schedule"
"""On each run a schedule creates: the schedule's name."""
SCHEDULED_LABEL = f"{GROUP}/scheduled-time"
"""On each run a schedule creates: its scheduled time, ``YYYYmmddTHHMMZ`` (UTC)."""
SCHEDULED_AT_ANNOTATION = f"{GROUP}/scheduled-at"
"""On each run a schedule creates: its scheduled time, RFC 3339 (what the decision reads)."""
