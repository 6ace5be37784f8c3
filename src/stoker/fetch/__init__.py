"""Fetch strategies: how one worker (or the main process) turns indices into samples: per
sample, on a thread pool, with its concurrency tuned; torch's semantics and the skip policy."""
