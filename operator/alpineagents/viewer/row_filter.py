"""Which rows of a run's timeline the page shows when a person searches or asks for errors.

The page holds only the rows in view (it asks for them a page at a time), so it cannot
search a long run itself: :func:`filtered_page` does it on the server, over the followed
run's whole timeline, and answers with the matching rows of a page of the filtered list
and the rows of their turns (the page draws a row's bar in its whole turn's window).
"""

from __future__ import annotations

from dataclasses import dataclass

from .timeline import JSON, ROW_COLUMNS, Row, Timeline

ERROR_STATUSES = frozenset({"error", "aborted", "refused", "max_turns"})
"""Statuses the "errors only" filter keeps: a tool call's failed, aborted or refused
outcome, a model request that failed or was taken back, a run that stopped on an error."""


@dataclass(frozen=True)
class RowFilter:
    """``query``: text a row must contain (any case; its title, text, status or call id);
    ``errors_only``: keep only rows whose status is one of :data:`ERROR_STATUSES`."""

    query: str = ""
    errors_only: bool = False

    def __bool__(self) -> bool:
        return bool(self.query.strip()) or self.errors_only

    def keeps(self, row: Row) -> bool:
        """Whether the row is shown under this filter."""
        if self.errors_only and row.status not in ERROR_STATUSES:
            return False
        words = self.query.strip().casefold()
        if not words:
            return True
        shown = f"{row.title}\n{row.text}\n{row.status}\n{row.call_id or ''}".casefold()
        return words in shown


def filtered_page(timeline: Timeline, keep: RowFilter, start: int, end: int) -> JSON:
    """Positions ``start`` to ``end`` of the rows ``keep`` keeps, as the page gets them:
    ``matches`` the kept rows' orders (their positions in the whole timeline), ``rows``
    those rows and the other rows of their turns, ``total_rows`` how many rows it keeps."""
    kept = [row.order for row in timeline.rows if keep.keeps(row)]
    matches = kept[max(0, start) : max(0, end)]
    sent: dict[int, Row] = {}
    for order in matches:
        if order not in sent:
            for row in timeline.page(order, order + 1):  # widened to the row's whole turn
                sent[row.order] = row
    return {
        "columns": ROW_COLUMNS,
        "rows": [sent[order].as_list() for order in sorted(sent)],
        "matches": matches,
        "start": start,
        "total_rows": len(kept),
    }
