"""The machinery behind gpurt.nvrtc: the kernel cache (memory and disk)."""
