"""Sends runs' end notifications (:mod:`.notifications`), beside the reconcile steps.

The watches hand every AgentRun to :meth:`Notifier.run_seen`; one whose end is due to be
told is queued (its key only, once) for one of :data:`SENDERS` sender tasks of its own, so
a slow or failing endpoint holds a sender, never a reconcile step. A try waiting for its
backoff is a timer. Each try reads the run afresh, marks it ``Sending`` only if it is
unchanged since (see :meth:`.Cluster.patch_status_at`), POSTs, and marks the outcome.
Only the leader runs this (the handlers run only there).

The auth header's value is read from its Secret for each try and goes nowhere but that
request: not into a log line, an Event, the status or an error message.
"""

from __future__ import annotations

import asyncio
import contextvars
import logging
from collections.abc import Callable
from datetime import datetime

import httpx2

from alpineagents_operator.deciding import notifications
from alpineagents_operator.deciding.notifications import Due, NotifyTarget
from alpineagents_operator.kube.cluster import Cluster, StatusConflict
from alpineagents_operator.kube.config import OperatorConfig
from alpineagents_operator.kube.views import JSON, AgentRunView, RunEvent
from alpineagents_operator.watching.refusals import secret_not_allowed
from alpineagents_operator.watching.watched import RunKey

_log = logging.getLogger(__name__)
SENDERS = 4
"""Notifications in flight at once (each waits on its endpoint, at most its timeout)."""
TIMEOUT_SECONDS = 10.0
_CONFLICTS = 5
"""Reads of a run in a row whose ``Sending`` mark another write beat, before the try is
left to the run's next event."""
_MARK_RETRY_SECONDS = 2.0


class _NotSent(Exception):
    """The request never reached the endpoint: a further try is safe."""


class Notifier:
    """Queues and sends the end notifications of the runs it is shown."""

    def __init__(
        self,
        config: OperatorConfig,
        cluster: Cluster,
        clock: Callable[[], datetime],
        *,
        transport: httpx2.AsyncBaseTransport | None = None,
    ) -> None:
        self._config = config
        self._cluster = cluster
        self._clock = clock
        self._transport = transport
        self._keys: asyncio.Queue[RunKey] = asyncio.Queue()
        self._queued: set[RunKey] = set()
        self._sending: set[RunKey] = set()
        self._again: set[RunKey] = set()
        self._timers: dict[RunKey, asyncio.TimerHandle] = {}
        self._senders: list[asyncio.Task[None]] = []
        self._tries: set[asyncio.Task[None]] = set()

    def run_seen(self, run: AgentRunView, *, gone: bool) -> None:
        """A watch event of ``run``: queue its notification if one is due now, or set a
        timer for when it is."""
        key = (run.namespace, run.name)
        if gone:
            timer = self._timers.pop(key, None)
            if timer is not None:
                timer.cancel()
            return
        wanted = notifications.due(run, self._clock())
        if wanted is None:
            return
        if wanted.at is not None:
            wait = (wanted.at - self._clock()).total_seconds()
            if wait > 0:
                self._later(key, wait)
                return
        self._queue(key)

    def close(self) -> None:
        for timer in self._timers.values():
            timer.cancel()
        self._timers.clear()
        for task in [*self._senders, *self._tries]:
            task.cancel()

    async def drain(self) -> None:
        """Stop taking notifications, and let the tries in flight end and be marked (at
        most their timeout): a try cut short would leave a ``Sending`` mark, which the
        next operator must read as Unknown and not send again."""
        for timer in self._timers.values():
            timer.cancel()
        self._timers.clear()
        for task in self._senders:
            task.cancel()
        if self._tries:
            await asyncio.wait(self._tries, timeout=TIMEOUT_SECONDS + 5.0)

    async def tried(self) -> None:
        """Return once every notification queued so far has been tried and marked (those
        waiting for a backoff are not queued yet)."""
        await self._keys.join()

    # ------------------------------------------------------------------ internals
    def _later(self, key: RunKey, wait: float) -> None:
        if key in self._timers:
            return
        loop = asyncio.get_running_loop()

        def fire() -> None:
            self._timers.pop(key, None)
            self._queue(key)

        self._timers[key] = loop.call_later(wait, fire, context=contextvars.Context())

    def _queue(self, key: RunKey) -> None:
        if key in self._sending:
            self._again.add(key)  # judged again once this try is marked
            return
        if key in self._queued:
            return
        self._queued.add(key)
        self._keys.put_nowait(key)
        if not self._senders:
            self._senders = [
                asyncio.create_task(self._send_forever(), context=contextvars.Context())
                for _ in range(SENDERS)
            ]

    async def _send_forever(self) -> None:
        while True:
            key = await self._keys.get()
            self._queued.discard(key)
            self._sending.add(key)
            attempt = asyncio.create_task(self._try(key))
            self._tries.add(attempt)
            attempt.add_done_callback(self._tries.discard)
            try:
                # Shielded: a sender cancelled by drain() lets its try end and be marked.
                await asyncio.shield(attempt)
            except Exception:  # one run's failure must not end the sender
                _log.exception("%s/%s: notification failed", *key)
            finally:
                self._sending.discard(key)
                self._keys.task_done()
            if key in self._again:
                self._again.discard(key)
                self._queue(key)

    async def _try(self, key: RunKey) -> None:
        """One try of the run's notification, from a fresh read of the run."""
        for _ in range(_CONFLICTS):
            body = await asyncio.to_thread(self._cluster.get_run, *key)
            if body is None:
                return
            run = AgentRunView.from_body(body)
            now = self._clock()
            wanted = notifications.due(run, now)
            if wanted is None:
                return
            if wanted.at is not None and wanted.at > now:
                self._later(key, (wanted.at - now).total_seconds())
                return
            resource_version = str(body["metadata"].get("resourceVersion") or "")
            try:
                if wanted.abandoned:
                    # Not this process's try (it is not sending it): an operator stopped
                    # while sending. The endpoint may have it; at most once: not again.
                    await self._settle(
                        body,
                        resource_version,
                        wanted,
                        notifications.UNKNOWN,
                        "the operator stopped while sending it; not sent again (at most once)",
                    )
                    return
                await self._attempt(body, run, resource_version, wanted)
                return
            except StatusConflict:
                continue  # written since the read: read again and judge afresh
        _log.info("%s/%s: notification left for the run's next event (busy)", *key)

    async def _attempt(
        self, body: JSON, run: AgentRunView, resource_version: str, wanted: Due
    ) -> None:
        target = NotifyTarget.of(run)
        assert target is not None
        if not self._config.notifications:
            off = "notifications are off in this installation (the chart's notifications.enabled)"
            await self._settle(body, resource_version, wanted, notifications.FAILED, off)
            return
        secret, problem = await self._secret(run, target)
        if problem is not None:
            await self._settle(body, resource_version, wanted, notifications.FAILED, problem)
            return
        claimed = await asyncio.to_thread(
            self._cluster.patch_status_at,
            run.namespace,
            run.name,
            resource_version,
            notifications.mark(wanted.id, notifications.SENDING, wanted.attempt, self._clock()),
        )
        if claimed is None:
            return  # the run is gone
        event = notifications.cloud_event(run, wanted.id, self._clock(), self._config.viewer_url)
        try:
            answered = await self._post(target, secret, notifications.encoded(event))
        except _NotSent as error:
            answered = None
            failure = str(error)
        except (httpx2.HTTPError, OSError) as error:
            await self._mark(body, wanted, notifications.UNKNOWN, _unknown_text(error))
            return
        else:
            failure = f"the endpoint answered {answered}"
        if answered is not None and 200 <= answered < 300:
            await self._mark(body, wanted, notifications.DELIVERED, None)
            return
        if wanted.attempt >= self._config.notify_attempts:
            text = f"{failure}; gave up after {wanted.attempt} tries"
            await self._mark(body, wanted, notifications.FAILED, text)
            return
        wait = notifications.backoff(wanted.attempt, self._config.notify_backoff_seconds)
        await self._mark(body, wanted, notifications.RETRYING, failure, retry_in=wait)
        self._later((run.namespace, run.name), wait)

    async def _secret(
        self, run: AgentRunView, target: NotifyTarget
    ) -> tuple[str | None, str | None]:
        """The auth header's value, and why there is none when one is asked for."""
        if target.secret_name is None:
            return None, None
        where = f"spec.notify.authSecretRef {target.secret_name!r}"
        if secret_not_allowed(target.secret_name, self._config):
            return None, f"{where} names a Secret of the operator's installation: name your own"
        if target.secret_key is None:
            return None, f"{where} names no key"
        try:
            value = await asyncio.to_thread(
                self._cluster.secret_value, run.namespace, target.secret_name, target.secret_key
            )
        except PermissionError as error:
            return None, f"{where}: {error} (the chart's notifications.enabled grants it)"
        if value is None:
            return None, f"{where} (key {target.secret_key!r}) does not exist in {run.namespace}"
        if "\n" in value.strip() or "\r" in value.strip():
            return None, f"{where} (key {target.secret_key!r}) holds more than one line"
        return value.strip(), None

    async def _post(self, target: NotifyTarget, secret: str | None, content: bytes) -> int:
        """POST the event; the status the endpoint answered. Raises :class:`_NotSent`
        when the connection never opened, and another ``httpx2.HTTPError`` when the
        request may have been received but no answer came."""
        headers = {"Content-Type": notifications.CONTENT_TYPE}
        if secret is not None:
            headers[target.header] = secret
        async with httpx2.AsyncClient(
            timeout=TIMEOUT_SECONDS, follow_redirects=False, transport=self._transport
        ) as client:
            try:
                response = await client.post(target.url, content=content, headers=headers)
            except (httpx2.ConnectError, httpx2.ConnectTimeout) as error:
                raise _NotSent(
                    f"the endpoint could not be reached ({type(error).__name__})"
                ) from None
            except httpx2.UnsupportedProtocol:
                raise _NotSent("spec.notify.url is not an http(s) URL") from None
            return response.status_code

    async def _settle(
        self, body: JSON, resource_version: str, wanted: Due, state: str, message: str
    ) -> None:
        """Mark a notification that will not be sent (only if the run is unchanged)."""
        meta = body["metadata"]
        patch = notifications.mark(wanted.id, state, wanted.attempt, self._clock(), message=message)
        patched = await asyncio.to_thread(
            self._cluster.patch_status_at, meta["namespace"], meta["name"], resource_version, patch
        )
        if patched is not None:
            await self._event(body, state, message)

    async def _mark(
        self,
        body: JSON,
        wanted: Due,
        state: str,
        message: str | None,
        *,
        retry_in: float | None = None,
    ) -> None:
        """Mark how a try went, until the API server takes it: the ``Sending`` mark it
        replaces is this process's, and left alone it would be read as abandoned."""
        meta = body["metadata"]
        patch = notifications.mark(
            wanted.id, state, wanted.attempt, self._clock(), message=message, retry_in=retry_in
        )
        while True:
            try:
                await asyncio.to_thread(
                    self._cluster.patch_status, meta["namespace"], meta["name"], patch
                )
                break
            except Exception as error:  # the API server down: the mark must still go
                _log.warning(
                    "%s/%s: notification mark not written (%s); trying again",
                    meta["namespace"],
                    meta["name"],
                    type(error).__name__,
                )
                await asyncio.sleep(_MARK_RETRY_SECONDS)
        if state != notifications.RETRYING:
            await self._event(body, state, message)

    async def _event(self, body: JSON, state: str, message: str | None) -> None:
        meta = body["metadata"]
        if state == notifications.DELIVERED:
            event = RunEvent("Normal", "Notified", "the run's end was delivered to spec.notify.url")
            _log.info("%s/%s: notification delivered", meta["namespace"], meta["name"])
        else:
            event = RunEvent("Warning", f"Notify{state}", message or state)
            _log.warning(
                "%s/%s: notification %s: %s", meta["namespace"], meta["name"], state, message
            )
        await asyncio.to_thread(self._cluster.post_event, body, event)


def _unknown_text(error: BaseException) -> str:
    return (
        f"sent, but no answer came ({type(error).__name__}): the endpoint may have it; "
        f"not sent again (at most once)"
    )
