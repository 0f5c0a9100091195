"""Does unloading code (cuLibraryUnload) during a global-mode graph capture invalidate it?
Session 17's suite failed once in test_frees_and_releases_during_capture_are_deferred, whose
gc.collect() mid-capture frees modules of earlier tests (a module and its kernels form a
cycle). Prints the capture's outcome with the unload and without it."""

from __future__ import annotations

from cuda.bindings import driver as cu

import gpurt

SOURCE = 'extern "C" __global__ void bump(float* x) { x[threadIdx.x] += 1.f; }'


def attempt(unload: bool) -> str:
    x = gpurt.zeros(32)
    module = gpurt.compile(SOURCE)
    bump = module["bump"]
    bump(1, 32, (x,))
    gpurt.synchronize()
    library = module.library()
    keep = gpurt.compile(SOURCE)["bump"]
    keep(1, 32, (x,))
    gpurt.synchronize()
    g = gpurt.CUDAGraph()
    try:
        with gpurt.graph(g):
            keep(1, 32, (x,))
            if unload:
                cu.cuLibraryUnload(library)
                module._libraries[0] = None  # unloaded here: the finalizer has nothing left
    except Exception as exc:  # noqa: BLE001 - the outcome is what this prints
        return f"capture failed: {exc}"
    return "capture ok"


if __name__ == "__main__":
    print("without an unload:", attempt(False))
    print("with cuLibraryUnload mid-capture:", attempt(True))
