"""Wires a loader to executors and transport: ordering, backpressure, shutdown."""
