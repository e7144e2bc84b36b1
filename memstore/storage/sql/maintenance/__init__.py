"""Operator work on whole databases: erase, vacuum, backup and restore."""
