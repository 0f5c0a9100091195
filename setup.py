"""Build configuration beyond pyproject.toml: the optional C extension gpurt._launch._claunch.

It is the compiled launch path (gpurt/_launch/kernel.py). ``optional=True``: where it cannot be built
(no C compiler, no Python headers) the install still succeeds and gpurt launches through
cuda.bindings from Python instead; ``gpurt info`` says which path is in use.
"""

from setuptools import Extension, setup

setup(ext_modules=[Extension("gpurt._launch._claunch", ["gpurt/_launch/_claunch.c"], optional=True)])
