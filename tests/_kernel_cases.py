"""Cases for the bundled kernels, shared by tests/test_kernels_property.py and
scripts/sanitize_sweep.py: operands stored the way users' views are (row- or column-major,
any leading dimension, at any element offset into a device buffer that ends exactly at the
view's last element, so a read past the view is a read past the allocation), one call of a
kernel on them, and its check against a float64 reference, including that nothing outside
the output view was written."""

from __future__ import annotations

import dataclasses
import importlib
from typing import Any

import numpy as np

import gpurt

gemm_mod = importlib.import_module("gpurt.kernels.gemm")
softmax_mod = importlib.import_module("gpurt.kernels.softmax")


@dataclasses.dataclass
class Stored:
    buffer: Any  # the flat device buffer
    host: np.ndarray  # its contents as last written or read back
    original: np.ndarray  # its contents when made (or last filled)
    view: Any  # the (rows x cols) gpurt view into the buffer
    rows: int
    cols: int
    col_major: bool
    offset: int
    ld: int

    def index(self) -> np.ndarray:
        """Flat buffer index of each view element, (rows x cols)."""
        i = np.arange(self.rows)[:, None]
        j = np.arange(self.cols)[None, :]
        return self.offset + (j * self.ld + i if self.col_major else i * self.ld + j)

    def logical(self) -> np.ndarray:
        return self.host[self.index()]

    def refresh(self) -> None:
        """Read the device buffer back into ``host``."""
        gpurt.synchronize()
        self.host = self.buffer.to_numpy()

    def set_logical(self, values: np.ndarray) -> None:
        self.host[self.index()] = np.asarray(values, dtype=np.float32).astype(self.host.dtype)
        self.original = self.host.copy()
        self.buffer.copy_(self.host)

    def fill_view(self, rng: np.random.Generator) -> None:
        self.set_logical(rng.standard_normal((self.rows, self.cols)))

    def snapshot(self) -> Stored:
        return dataclasses.replace(self, host=self.host.copy())

    def assert_outside_untouched(self, label: str) -> None:
        outside = np.ones(self.host.size, dtype=bool)
        outside[self.index().ravel()] = False
        bits = np.dtype(f"u{self.host.dtype.itemsize}")
        changed = self.host.view(bits)[outside] != self.original.view(bits)[outside]
        assert not changed.any(), f"{label}: {changed.sum()} elements outside the view written"


def stored(rng: np.random.Generator, rows: int, cols: int, dtype: Any, col_major: bool,
           offset: int, pad: int, poison: bool = False) -> Stored:
    """A (rows x cols) matrix of random values (NaN when ``poison``) stored row-major
    (column-major when ``col_major``) with a leading dimension ``pad`` above the minimum,
    ``offset`` elements into its buffer; the rest of the buffer is random too."""
    inner, outer = (rows, cols) if col_major else (cols, rows)
    ld = inner + pad
    size = offset + (outer - 1) * ld + inner if inner and outer else offset
    size = max(size, 1)
    if poison:
        host = np.full(size, np.nan, dtype=np.float32).astype(dtype)
    else:
        host = rng.standard_normal(size).astype(np.float32).astype(dtype)
    buffer = gpurt.asarray(host)
    item = np.dtype(dtype).itemsize
    strides = (item, ld * item) if col_major else (ld * item, item)
    view = buffer._view(offset * item, (rows, cols), strides)
    return Stored(buffer, host.copy(), host.copy(), view, rows, cols, col_major, offset, ld)


# ---- gemm --------------------------------------------------------------------------------------

GEMM_DTYPES = {"float32": np.float32, "tf32": np.float32, "float16": np.float16,
               "bfloat16": gpurt.bfloat16}
# |error| <= OUT_EPS * |ref| (the output's rounding) + ACC_TOL * (|alpha| |a| |b| + |beta c|)
OUT_EPS = {"float32": 1e-6, "tf32": 1e-6, "float16": 2.0**-10, "bfloat16": 2.0**-7}
ACC_TOL = {"float32": 1e-5, "tf32": 2e-3, "float16": 1e-4, "bfloat16": 1e-4}

Layout = tuple[bool, int, int]  # (column-major storage, element offset, leading-dim pad)


@dataclasses.dataclass(frozen=True)
class GemmCase:
    m: int
    n: int
    k: int
    dtype: str  # a GEMM_DTYPES key
    trans_a: bool = False
    trans_b: bool = False
    a_layout: Layout = (False, 0, 0)
    b_layout: Layout = (False, 0, 0)
    out_layout: Layout | None = None  # None: gemm allocates the output
    alpha: float = 1.0
    beta: float = 0.0
    c_is_out: bool = False  # beta != 0: c is out itself (else a matrix of its own)


def _gemm_operands(case: GemmCase, rng: np.random.Generator,
                   ) -> tuple[Stored, Stored, Stored | None, Stored | None]:
    """(a, b, out, c) for ``case``; out poisoned outside c's values."""
    dtype = GEMM_DTYPES[case.dtype]
    a_shape = (case.k, case.m) if case.trans_a else (case.m, case.k)
    b_shape = (case.n, case.k) if case.trans_b else (case.k, case.n)
    a = stored(rng, *a_shape, dtype, *case.a_layout)
    b = stored(rng, *b_shape, dtype, *case.b_layout)
    out = None
    if case.out_layout is not None:
        out = stored(rng, case.m, case.n, dtype, *case.out_layout, poison=True)
    c = None
    if case.beta and case.c_is_out:
        assert out is not None, "c_is_out needs out"
        out.fill_view(rng)
        c = out.snapshot()
    elif case.beta:
        c = stored(rng, case.m, case.n, dtype, *case.a_layout)
    return a, b, out, c


def gemm_configs(case: GemmCase, rng: np.random.Generator) -> list[Any]:
    """Every config gemm can be forced to run ``case`` with (operands drawn from ``rng``:
    their alignment is what matters, and it is the same for every draw)."""
    a, b, out, _ = _gemm_operands(case, rng)
    return gemm_mod.gemm_eligible_configs(a.view, b.view, None if out is None else out.view,
                                          case.trans_a, case.trans_b,
                                          allow_tf32=case.dtype == "tf32")


def run_gemm(case: GemmCase, config: Any, rng: np.random.Generator) -> None:
    """One gemm call (``config`` forced, or None: gemm's choice) checked against float64."""
    a, b, out, c = _gemm_operands(case, rng)
    result = gemm_mod.gemm(a.view, b.view, out=None if out is None else out.view,
                           alpha=case.alpha, beta=case.beta,
                           c=None if (c is None or case.c_is_out) else c.view,
                           trans_a=case.trans_a, trans_b=case.trans_b,
                           allow_tf32=case.dtype == "tf32", config=config)
    label = f"{'chosen' if config is None else config.label()} on {case}"
    got = _returned(result, out, label)
    a64, b64 = a.logical().astype(np.float64), b.logical().astype(np.float64)
    op_a = a64.T if case.trans_a else a64
    op_b = b64.T if case.trans_b else b64
    want = case.alpha * (op_a @ op_b)
    scale = abs(case.alpha) * (np.abs(op_a) @ np.abs(op_b))
    if c is not None:
        c64 = c.logical().astype(np.float64)
        want = want + case.beta * c64
        scale = scale + abs(case.beta) * np.abs(c64)
    _assert_close(got, want, OUT_EPS[case.dtype] * np.abs(want) + ACC_TOL[case.dtype] * scale,
                  label)


def _returned(result: Any, out: Stored | None, label: str) -> np.ndarray:
    """The call's values: ``out``'s view (which the call must have returned, leaving the
    rest of its buffer untouched), or the new array it returned."""
    if out is None:
        return np.asarray(result.to_numpy())
    assert result is out.view, label
    out.refresh()
    out.assert_outside_untouched(label)
    return out.logical()


def _assert_close(got: np.ndarray, want: np.ndarray, bound: np.ndarray, label: str) -> None:
    got = np.asarray(got, dtype=np.float64)
    assert got.shape == want.shape, (label, got.shape, want.shape)
    assert np.isfinite(got).all(), f"{label}: unwritten (NaN) elements"
    bad = np.abs(got - want) > bound + 1e-30
    assert not bad.any(), f"{label}: {bad.sum()} wrong elements, first at {np.argwhere(bad)[0]}"


# ---- softmax and relatives -------------------------------------------------------------------

SOFTMAX_DTYPES = {"float32": np.float32, "float16": np.float16, "bfloat16": gpurt.bfloat16}
SOFTMAX_EPS = {"float32": 2e-6, "float16": 2.0**-10, "bfloat16": 2.0**-7}
OPS = ("softmax", "log_softmax", "softmax_backward", "log_softmax_backward")


@dataclasses.dataclass(frozen=True)
class SoftmaxCase:
    op: str  # one of OPS
    dtype: str  # a SOFTMAX_DTYPES key
    rows: int
    cols: int
    offsets: tuple[int, int, int] = (0, 0, 0)  # element offsets of the inputs and the output
    given_out: bool = False


def softmax_reference(op: str, x: np.ndarray, dy: np.ndarray | None) -> np.ndarray:
    """float64 result of ``op``; backward ops take the forward output as ``x``."""
    x = x.astype(np.float64)
    if op == "softmax":
        e = np.exp(x - x.max(-1, keepdims=True))
        return e / e.sum(-1, keepdims=True)
    if op == "log_softmax":
        shifted = x - x.max(-1, keepdims=True)
        return shifted - np.log(np.exp(shifted).sum(-1, keepdims=True))
    assert dy is not None
    dy = dy.astype(np.float64)
    if op == "softmax_backward":
        return x * (dy - (dy * x).sum(-1, keepdims=True))
    return dy - np.exp(x) * dy.sum(-1, keepdims=True)


def run_softmax(case: SoftmaxCase, rng: np.random.Generator) -> None:
    """One call of ``case.op`` on offset views, checked against float64."""
    dtype = SOFTMAX_DTYPES[case.dtype]
    rows, cols = case.rows, case.cols
    x = stored(rng, rows, cols, dtype, False, case.offsets[0], 0)
    dy = None
    if case.op.endswith("backward"):  # x holds the forward output y
        forward = case.op.replace("_backward", "")
        x.set_logical(softmax_reference(forward, rng.standard_normal((rows, cols)), None))
        dy = stored(rng, rows, cols, dtype, False, case.offsets[1], 0)
    out = stored(rng, rows, cols, dtype, False, case.offsets[2], 0, poison=True) \
        if case.given_out else None
    fn = getattr(softmax_mod, case.op)
    target = None if out is None else out.view
    result = fn(x.view, out=target) if dy is None else fn(dy.view, x.view, grad_in=target)
    label = str(case)
    got = _returned(result, out, label)
    want = softmax_reference(case.op, x.logical(), None if dy is None else dy.logical())
    scale = np.abs(want)
    if dy is not None and rows:
        scale = scale + np.abs(dy.logical().astype(np.float64)).max(-1, keepdims=True)
    eps = 8 * SOFTMAX_EPS[case.dtype] + (cols * 1e-7 if case.dtype == "float32" else 0.0)
    _assert_close(got, want, eps * (scale + 1e-3), label)
