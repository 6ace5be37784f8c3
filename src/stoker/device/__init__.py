"""Host-to-device staging: pinned memory."""
