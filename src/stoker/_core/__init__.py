"""Frozen specs, protocols and sentinels shared by every layer (stdlib and typing only)."""
