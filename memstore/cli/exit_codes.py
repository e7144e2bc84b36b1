"""The ``memstore`` command's exit codes, in one place (documented in docs/operations.md)."""

EXIT_ERROR = 1
"""A memstore error, printed as one line on stderr."""
EXIT_USAGE = 2
"""Click's usage error: unknown option, bad value; or a deletion without ``--yes`` and no terminal."""
EXIT_INVALID_ITEMS = 3
"""``import`` finished, but some items were invalid (the valid ones were imported)."""
EXIT_NOTHING_MATCHED = 4
"""``show``, ``erase``, ``sessions show|clear`` or ``agent-doc show|erase`` found nothing stored for
the user (or scope, session, agent document or version): usually a mistyped id."""
EXIT_CANNOT_LISTEN = 5
"""``serve`` could not listen on the address and port (in use, not permitted, no such address)."""
EXIT_DOCTOR_FAILED = 6
"""``doctor`` found a part of the setup that cannot work (a line marked ``fail``)."""
EXIT_CONFLICT = 7
"""``agent-doc edit``: the document changed while it was being edited (an agent or another operator
wrote it); nothing was written, and the edited text was kept in a file the message names."""
