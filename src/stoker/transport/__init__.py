"""Shared-memory transport between worker processes and the main process."""
