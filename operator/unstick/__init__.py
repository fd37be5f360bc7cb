"""unstick: finds pods stuck in Terminating, works out why, and fixes the cause where safe."""

__version__ = "0.1.0"
