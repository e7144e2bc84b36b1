"""Session stores: the contract (``contract.py``) and the process-memory and Redis backends."""
