"""Orphaned pod directories (design.md §9): the pass that finds and cleans them, and the
Node Event that reports them."""
