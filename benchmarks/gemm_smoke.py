"""Quick device check of every GEMM kernel family in every operand layout against a float64
product (torch), printed one line per case as it finishes: run first on a new device or after a
kernel change, under a time limit, so a hang or a wrong layout shows before longer runs.

    python benchmarks/gemm_smoke.py
"""

from __future__ import annotations

import importlib
import itertools
import os
import time

import torch

import gpurt

gemm_mod = importlib.import_module("gpurt.kernels.gemm")
tune = importlib.import_module("gpurt.kernels._gemm_tune")


def main() -> None:
    cases = [(tune._WGMMA[0], torch.bfloat16), (tune._WGMMA[1], torch.float16),
             (tune._WGMMA[2], torch.bfloat16), (tune._WGMMA[4], torch.bfloat16),
             (tune._WGMMA[5], torch.float16), (tune._WGMMA[6], torch.bfloat16),
             (tune._MMA[0], torch.bfloat16), (tune._MMA[3], torch.float16),
             (tune._TF32[0], torch.float32), (tune._SIMT[0], torch.float32),
             (tune._SIMT[1], torch.float32)]
    only = os.environ.get("SMOKE_ONLY")  # e.g. "wgmma"
    if only:
        cases = [case for case in cases if case[0].kernel == only]
    m, n, k = 296, 520, 200
    failures = 0
    for (config, dtype), (ta, tb) in itertools.product(cases, itertools.product((0, 1), (0, 1))):
        a = torch.randn((k, m) if ta else (m, k), device="cuda", dtype=dtype)
        b = torch.randn((n, k) if tb else (k, n), device="cuda", dtype=dtype)
        out = torch.full((m, n), float("nan"), device="cuda", dtype=dtype)
        t0 = time.perf_counter()
        try:
            gemm_mod.gemm(a, b, out=out, trans_a=bool(ta), trans_b=bool(tb), config=config,
                          stream=torch.cuda.current_stream(), allow_tf32=config.bk == 16)
            torch.cuda.synchronize()
            ref = (a.double().T if ta else a.double()) @ (b.double().T if tb else b.double())
            err = float(torch.linalg.norm(out.double() - ref) / torch.linalg.norm(ref))
            status = "ok" if err < (5e-3 if dtype == torch.float32 and config.bk == 16 else
                                    1e-5 if dtype == torch.float32 else 1e-2) else "WRONG"
        except Exception as exc:  # report and go on to the next case
            err, status = float("nan"), f"ERROR {type(exc).__name__}: {str(exc)[:300]}"
        failures += status != "ok"
        print(f"{config.label():32s} {str(dtype):15s} trans_a={ta} trans_b={tb} err={err:.3g} "
              f"{time.perf_counter() - t0:.2f}s {status}", flush=True)
    options = os.environ.get("GPURT_GEMM_NVRTC_OPTIONS", "")
    print(f"smoke: {failures} failures on {gpurt.get_device_name()} {options}")


if __name__ == "__main__":
    main()
