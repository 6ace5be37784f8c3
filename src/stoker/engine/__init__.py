"""The engine: iterators that drive executors over a transport: dispatch, ordering,
backpressure, resume state, stats and shutdown."""
