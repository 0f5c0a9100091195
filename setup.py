"""Build configuration beyond pyproject.toml: the optional C extension gpurt._launch._claunch,
and, opt-in, the bundled kernels prebuilt into the wheel.

The extension is the compiled launch path (gpurt/_launch/kernel.py). ``optional=True``: where
it cannot be built (no C compiler, no Python headers) the install still succeeds and gpurt
launches through cuda.bindings from Python instead; ``gpurt info`` says which path is in use.

``GPURT_BUILD_KERNELS=sm_80,sm_90a,sm_100`` makes build_py also run ``gpurt build-kernels`` for
those architectures (those the NVRTC in use can target) into gpurt/kernels/prebuilt.gpak of
the build, so the wheel carries them (docs/aot.md). It runs gpurt from the build folder, so
gpurt's dependencies must be importable: build with ``python -m build --no-isolation`` or
``pip wheel --no-build-isolation`` in an environment that has them. Unset (CI's editable
install), nothing is compiled.
"""

import os
import subprocess
import sys

from setuptools import Extension, setup
from setuptools.command.build_py import build_py

SOURCES = ["_claunch.c", "_claunch_launcher.c", "_claunch_packing.c", "_claunch_planned.c",
           "_claunch_signature.c", "_claunch_dispatch.c", "_claunch_torch.c"]  # with the .h files


class BuildPyWithKernels(build_py):
    """build_py, then the prebuilt kernel archive when GPURT_BUILD_KERNELS names archs."""

    def run(self) -> None:
        super().run()
        archs = os.environ.get("GPURT_BUILD_KERNELS", "").strip()
        if not archs or self.dry_run:
            return
        target = os.path.join(self.build_lib, "gpurt", "kernels", "prebuilt.gpak")
        path = os.pathsep.join(p for p in (self.build_lib, os.environ.get("PYTHONPATH")) if p)
        env = {**os.environ, "PYTHONPATH": path, "GPURT_PREBUILT": "0"}
        subprocess.check_call([sys.executable, "-m", "gpurt", "build-kernels", "-o", target],
                              env=env)  # --arch from GPURT_BUILD_KERNELS


setup(
    cmdclass={"build_py": BuildPyWithKernels},
    ext_modules=[Extension(
        "gpurt._launch._claunch",
        [f"gpurt/_launch/{name}" for name in SOURCES],
        depends=["gpurt/_launch/_claunch.h", "gpurt/_launch/_claunch_dispatch.h"],
        optional=True,
    )],
)
