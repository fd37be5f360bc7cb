"""The pure core: diagnosis, planning, policy and parsing. No I/O, no clock reads."""
