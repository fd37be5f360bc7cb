"""Who holds a mount (design.md §3 invariant 9): the scan of /proc, mount-namespace copies,
and one scan shared by a burst of checks."""
