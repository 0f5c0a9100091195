"""Machinery behind gpurt.elementwise and gpurt.jiterator: types and promotion, layouts and
broadcasting, CUDA code generation and planned launches (public gpurt API only)."""
