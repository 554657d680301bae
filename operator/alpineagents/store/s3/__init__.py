"""MinioStore: States in any S3-compatible object store (needs the ``minio`` extra).

:mod:`.minio_store` holds the store (its docstring describes the layout, merging and
fencing); :mod:`.slots` the pure algebra of its slots, :mod:`.objects` its requests, and
:mod:`.legacy` with :mod:`.segments` the reading of layout 1.
"""

from ...errors import MissingBucketError, StateFencedError, StoreUnavailableError
from .minio_store import MinioStore

__all__ = ["MinioStore", "MissingBucketError", "StateFencedError", "StoreUnavailableError"]
