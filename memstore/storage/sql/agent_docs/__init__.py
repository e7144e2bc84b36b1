"""The agent documents in the memory database (``memstore/agent_doc.py``)."""
