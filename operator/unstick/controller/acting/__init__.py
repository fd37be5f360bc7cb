"""The controller's own acts (force-delete, remove-finalizer) and its action budget."""
