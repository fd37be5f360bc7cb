"""The node actions of design.md §3, a module each, the checks they share, and the executor
that dispatches to them."""
