"""Exception types that callers are expected to catch by name."""


class MemstoreError(Exception):
    """Base class so a gateway can catch every memstore failure in one clause."""


class ConfigError(MemstoreError, ValueError):
    """Raised at startup for configuration that cannot work; the message names the field."""


class StorageUnavailableError(MemstoreError):
    """The backing store cannot be reached (database down, disk gone); retrying later may succeed."""


class InvalidScopeError(MemstoreError, ValueError):
    """A user id or agent name that could escape its scope (path traversal, bad characters)."""
