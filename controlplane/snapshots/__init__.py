"""Snapshots of sandboxes, above sandboxes/: their records, quotas, retention and collection
(docs/sandboxes.md#snapshots)."""
