"""Build configuration beyond pyproject.toml: the optional C extension gpurt._launch._claunch.

It is the compiled launch path (gpurt/_launch/kernel.py). ``optional=True``: where it cannot be built
(no C compiler, no Python headers) the install still succeeds and gpurt launches through
cuda.bindings from Python instead; ``gpurt info`` says which path is in use.
"""

from setuptools import Extension, setup

SOURCES = ["_claunch.c", "_claunch_launcher.c", "_claunch_packing.c", "_claunch_planned.c",
           "_claunch_signature.c"]  # with _claunch.h

setup(ext_modules=[Extension(
    "gpurt._launch._claunch",
    [f"gpurt/_launch/{name}" for name in SOURCES],
    depends=["gpurt/_launch/_claunch.h"],
    optional=True,
)])
