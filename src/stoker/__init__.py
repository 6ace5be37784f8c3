"""stoker: keeps the accelerator fed. A drop-in, faster, safer torch DataLoader."""
