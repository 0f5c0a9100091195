"""The machinery behind gpurt.random: generator states (state.py), their CUDA graph
bookkeeping (capture.py), the kernels (kernels.py, random.cu) and the fills (fill.py).
The header for users' kernels is include/gpurt/random.cuh."""
