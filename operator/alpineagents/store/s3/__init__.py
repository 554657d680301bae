"""MinioStore: States in any S3-compatible object store (MinIO, SeaweedFS, AWS S3, ...).

Only plain S3 API calls are used (PUT/GET/HEAD/DELETE object, ListObjectsV2, DeleteObjects,
and conditional PUTs with ``If-None-Match: *`` / ``If-Match: <etag>``), never MinIO-only ones.

Layout (2)
----------
Under ``<prefix>`` (``""`` or ``"some/folder/"``) each State has a folder named by
:func:`~alpineagents.store.base.encode_id` (no ``/``, ``..`` or NUL can reach out of it)::

    <prefix><enc id>/info.json                                  written once, at create
    <prefix><enc id>/h-<incarnation>/s-<slot:012d>.jsonl        one a save
    <prefix><enc id>/h-<incarnation>/m-<low>-<high>-<first>-<last>.jsonl   merged slots

``info.json`` (``{"store": 2, "incarnation": "…", "writer": "…"}``) says the State exists
and which incarnation of its id is current. The history is a *chain* of slots 0, 1, 2, ...,
each an immutable object: a header line (``first``/``last`` entry, ``epoch``, ``writer``
token, the Store ``info`` of that save, ``kind``, ``post``), then its entries as JSON lines.
A merged object holds what slots ``low..high`` held, with the header of slot ``high``.

A save is one request: ``PUT s-<next slot>`` with ``If-None-Match: *``. A slot number is
taken once, by whoever creates it first, so the create is both the write and the fence.
The State's info for ``list()`` is the header of its newest slot (no second object to
rewrite per save).

What a read sees
----------------
``read`` GETs ``info.json``, lists ``h-<incarnation>/`` once and fetches, in parallel, the
fewest objects that hold every slot from 0 to the highest (:func:`.slots.cover`). Every
slot of the chain is visible as soon as its PUT succeeded; there is nothing uncommitted.

Fencing: one writer per State
-----------------------------
A writer writes slot ``k`` only after slots ``0..k-1``, so a slot it finds taken was taken
by someone else: it raises :class:`StateFencedError`, and stays fenced (every later write
of that id through this store instance raises too, until it loads the State again).

- :meth:`MinioStore.claim` takes a State over by creating the next slot itself, a *claim*
  slot (no entries, a new ``epoch`` and writer token). The old writer's next save targets
  that slot, or one before it that the old writer wrote itself: refused either way. If this
  instance has read the State (``load``) and not written it since, the claim is the slot
  after what it read, so it fails with :class:`StateFencedError` if anyone wrote in between
  (load again). Otherwise it claims whatever is saved now, retrying on races (the operator
  does this before starting a replacement pod).
- A write by an instance that does not own the State claims it on the way: its first slot
  opens a new epoch, after the slot its read saw last (so ``load`` in a new process, then
  saving, just works, in one request plus one listing). After a read, it refuses entries
  that start before what the read returned (they come from an older copy of the State).
- The first slot of each epoch is a *fence post*: merges keep it, so a fenced writer's
  create of it is refused for as long as the State exists. Other slots may be deleted
  once a merged object holds them; a writer can only target such a slot after losing the
  answer to its own create, and then (a *checked* write) it lists the chain after its
  create and finds that it lost.
- A create retried after a lost answer gets 412 for its own success: the writer GETs the
  slot and recognises its own token.

Merging
-------
Each save adds a slot. When ``merge_after`` (16) slots have been saved since the last
merge, a background thread (never the save) merges the newest objects into one:
size-tiered (an older object joins while it is at most twice the size of what is merged
so far) and at most ``merge_bytes`` (1 MiB) per merged object, so each entry is rewritten
O(log n) times and a load fetches about ``history / merge_bytes + merge_after + log``
objects. The merged object is PUT first, then the objects it holds are deleted (except
fence posts), so a merge stopped at any point leaves every slot readable (a read re-lists
if an object vanishes under it). A failed merge is tried again ``merge_after`` saves
later. Merges use the slots this instance wrote from memory (up to ``cache_bytes``) and
GET only the others. :meth:`MinioStore.wait_for_merges` waits for this instance's.

Creating and deleting
---------------------
``create=True`` lists the id's folder (an existing ``info.json`` is refused at once, with
nothing written), PUTs slot 0 of a fresh incarnation, then ``info.json`` with
``If-None-Match: *``. Losing that race deletes the slot again and raises ``ValueError``.
Folders of incarnations without an ``info.json`` (a create that crashed between its PUTs,
a deleted State's fence) are removed by the next create of that id.

``delete`` first creates a *deleted* slot after the chain (a writer still saving the State
finds it and raises ``LookupError``), then removes ``info.json`` and every other object of
the id, except those of a State created again with that id meanwhile. That one small
object stays, so the writer stays refused, until the id is created again.

Layout 1
--------
States saved by earlier versions (an ``info.json`` with ``"store": 1``) are read as they
are and converted on their first write or claim: all of it is in :mod:`.legacy`.

Timeouts and retries
--------------------
Every operation (``write``, ``read``, ``list``, ``delete``, ``claim``) has a budget of
``retry_budget`` seconds: idempotent requests and conditional PUTs (see fencing) are retried
with backoff on connection errors, timeouts and 5xx answers until it is spent, then
:class:`StoreUnavailableError` is raised. With a client built by :meth:`MinioStore.connect`
(or one given ``http_client=MinioStore.http_client()``), every socket wait is cut to what is
left of the budget, so an operation fails within ``retry_budget`` seconds even when the
server hangs. A client with its own ``urllib3.PoolManager`` keeps that pool's timeouts (the
``minio`` default is 5 minutes) and its retries; the store's retries come on top.

The modules: :mod:`.minio_store` (the store: layout 2's saves, reads, creates, deletes),
:mod:`.fencing` (taking a State over, creating its next slot, finding it taken),
:mod:`.merges` (the background merges), :mod:`.chains` (what an instance holds of each
State, and ``info.json``), :mod:`.slots` (the pure algebra of its
slots), :mod:`.pieces` (a State's pieces listed, fetched, cached and merged),
:mod:`.objects` (its requests), :mod:`.legacy` (all of layout 1) and
:mod:`.credential_files` (credentials read again when a Secret renews them).
"""

from ...errors import MissingBucketError, StateFencedError, StoreUnavailableError
from .minio_store import MinioStore

__all__ = ["MinioStore", "MissingBucketError", "StateFencedError", "StoreUnavailableError"]
