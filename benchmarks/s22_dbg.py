"""Session 22 (issue 17): the pieces of gpurt.asarray on a torch tensor, timed one by one
(whether the C view takes it, and what the Python path costs where it does not), then a
cProfile of 3000 calls.

    python benchmarks/s22_dbg.py
"""

from __future__ import annotations

import cProfile
import io
import pstats
import statistics
import time
from collections.abc import Callable
from typing import Any


def us(fn: Callable[[], Any], count: int = 3000) -> float:
    samples = []
    for _ in range(5):
        t0 = time.perf_counter()
        for _ in range(count):
            fn()
        samples.append((time.perf_counter() - t0) / count * 1e6)
    return round(statistics.median(samples), 3)


def main() -> None:
    import torch

    import gpurt
    from gpurt import array as garray
    from gpurt._array import interop
    from gpurt._core.state import current_place

    t = torch.randn(97, 4099, device="cuda")
    print("place before", current_place(), "view", interop.view)
    x = gpurt.asarray(t)
    print("place after", current_place(), "view", interop.view)
    print("view(t) ->", type(interop.view(t)).__name__)
    pieces: dict[str, Callable[[], Any]] = {
        "interop.view": lambda: interop.view(t),
        "torch_fields": lambda: interop.torch_fields(t, None),
        "_device_view": lambda: garray._device_view(t, None),
        "asarray": lambda: gpurt.asarray(t),
        "describe": lambda: interop.describe(t, None),
        "Array made": lambda: garray._make(1, (1,), (4,), x.dtype, x.device, None, t, True),
        "current_place": current_place,
    }
    for name, fn in pieces.items():
        print(f"{name:16s} {us(fn)} us")
    prof = cProfile.Profile()
    prof.enable()
    for _ in range(3000):
        gpurt.asarray(t)
    prof.disable()
    text = io.StringIO()
    pstats.Stats(prof, stream=text).sort_stats("tottime").print_stats(15)
    print(text.getvalue())


if __name__ == "__main__":
    main()
