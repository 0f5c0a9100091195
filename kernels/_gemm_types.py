"""Element type codes of the GEMM kernels, shared with gemm_common.cu (the DT template
parameter): the one module both kernels/_gemm_tune.py and kernels/_gemm_skinny.py import."""

from __future__ import annotations

__all__ = ["DT_F32", "DT_F16", "DT_BF16", "DT_TF32", "DT_NAMES"]

# DT_TF32: fp32 data on the TF32 tensor cores.
DT_F32, DT_F16, DT_BF16, DT_TF32 = 0, 1, 2, 3
DT_NAMES = {DT_F32: "float32", DT_F16: "float16", DT_BF16: "bfloat16", DT_TF32: "tf32"}
