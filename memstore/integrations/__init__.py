"""Adapters for agent frameworks and web servers, each behind its own optional extra.

Import the submodule you need (``memstore.integrations.langchain``,
``memstore.integrations.fastapi``, ``memstore.integrations.mcp``); this package imports nothing
so the core install stays lean.
"""
