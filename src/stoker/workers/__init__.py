"""Worker processes: how they start and stop, their main loop, the message protocol both sides
speak, and how their errors and stacks travel back."""
