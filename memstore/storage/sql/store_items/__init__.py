"""The LangGraph store's items in the memory database (``memstore/integrations/langgraph_store.py``)."""
