"""The data interface every store keeps (spec: "Write your own store"), store by store.

The tests are the shipped suite, :class:`alpineagents.testing.conformance.StoreConformance`
(users run it on their own stores); here it runs over the ``store`` fixture of
tests/bench/stores.py: FileStore, the spec's MemoryStore, and MinioStore on real MinIO
and SeaweedFS.
"""

from __future__ import annotations

from alpineagents import FileStore, Store
from alpineagents.store.s3 import MinioStore
from alpineagents.testing.conformance import TRICKY_IDS, StoreConformance


class TestStoreConformance(StoreConformance):
    def check_ids_stay_inside(self, store: Store) -> None:
        if isinstance(store, FileStore):
            assert [p.name for p in store.folder.parent.iterdir()] == ["runs"]
            folders = list(store.folder.iterdir())
            assert len(folders) == len(TRICKY_IDS)
            assert all(p.parent == store.folder for p in folders)
        if isinstance(store, MinioStore):
            listing = store.client.list_objects(store.bucket, recursive=True)
            keys = [str(item.object_name) for item in listing]
            assert keys and all(key.startswith("runs/") for key in keys)
            assert all("/../" not in key and "/./" not in key for key in keys)
