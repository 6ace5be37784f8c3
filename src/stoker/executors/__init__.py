"""Executors: where fetches run (main thread, worker processes), and how their errors travel."""
