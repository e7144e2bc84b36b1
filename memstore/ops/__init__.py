"""Operations on stored memory outside the pipeline: fact edits, cross-scope queries, import/export."""
