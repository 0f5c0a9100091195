"""Bundled kernels written against gpurt's public API (installed as ``gpurt.kernels``)."""

__all__: list[str] = []
