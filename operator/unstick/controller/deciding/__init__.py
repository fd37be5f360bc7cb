"""Deciding about one stuck pod: detection from memory, the diagnosis inputs, the policies
in force, the Node/CSINode caches and finalizer owners."""
