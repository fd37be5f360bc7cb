"""Subcommands of the `unstick` CLI."""
