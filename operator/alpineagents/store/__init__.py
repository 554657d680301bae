"""Where States are saved: the :class:`Store` interface and the stores that come with it.

- :mod:`.base`: the interface every store keeps (``write``/``read``/``list``/``delete``)
  and what is built on it once for all (``load``, ``save``), with :class:`Record` and
  :class:`StateInfo`.
- :mod:`.file`: :class:`FileStore`, one folder on local disk (the default).
- :mod:`.s3`: ``MinioStore``, for MinIO or any S3 (needs the ``minio`` extra, so it is
  imported from ``alpineagents.store.s3`` and not here).
- :mod:`.url`: :func:`open_store`, a store from a URL (``file:///...``, ``s3://...``).
- :mod:`.wrapped`: :class:`WrappedStore`, a store in front of another (EncryptedStore,
  the runner's LoggedStore) that keeps only its hooks.
- :mod:`.jsonl`: the JSON-lines form of history entries both stores write.

The errors stores raise are one family, in :mod:`alpineagents.errors`.
"""

from .base import Record, StateInfo, Store
from .file import FileStore
from .url import open_store, redact
from .wrapped import WrappedStore

__all__ = ["FileStore", "Record", "StateInfo", "Store", "WrappedStore", "open_store", "redact"]
