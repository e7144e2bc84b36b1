"""The database session store: sessions in the memory database (revision 0010)."""
