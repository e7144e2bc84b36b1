"""The document path: load, merge-safe save, its cache, codec and audit rows."""
