"""Session 22: one call each of gemm's fp32 x @ W.T pick at M = 1 (rowload's dot products) and
cuBLAS's (torch.matmul, TF32 off), between cudaProfilerStart / Stop, for Nsight Compute
(benchmarks/s22_gemv_ncu.sh).

    ncu --profile-from-start off ... python benchmarks/s22_gemv_ncu.py
"""

from __future__ import annotations

import importlib


def main() -> None:
    import torch

    gemm = importlib.import_module("gpurt.kernels.gemm").gemm
    torch.backends.cuda.matmul.allow_tf32 = False
    for n, k in ((4096, 4096), (14336, 4096)):
        x = torch.randn(1, k, device="cuda")
        w = torch.randn(n, k, device="cuda")
        out = torch.empty(1, n, device="cuda")
        gemm(x, w.T, out=out)  # compile and plan outside the profiled range
        torch.matmul(x, w.T, out=out)
        torch.cuda.synchronize()
        torch.cuda.cudart().cudaProfilerStart()
        gemm(x, w.T, out=out)
        torch.matmul(x, w.T, out=out)
        torch.cuda.synchronize()
        torch.cuda.cudart().cudaProfilerStop()


if __name__ == "__main__":
    main()
