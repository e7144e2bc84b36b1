"""The schema: tables, row-level security, the Alembic chain and how to apply or undo it."""
