"""Reads across scopes: listing and full-text queries, fact vectors and nearest neighbours."""
