"""The diagnosis rules of design.md §2 and §9: which stage of the termination is blocked,
and what a stuck pod blocks. Pure."""
