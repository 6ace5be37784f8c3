"""Measuring the loader: worker memory watch (``memory_watch``)."""
