"""The importing process of tests/test_ipc.py: ``python tests/_ipc_worker.py DIR N``.

For each i < N it reads DIR/handle{i}.bin (an exported gpurt.IpcHandle's bytes), the
expected values' bits DIR/expected{i}.npy and their dtype's name DIR/dtype{i}.txt, opens the
array, checks its shape, dtype and values, then writes ``expected * 2 + 1`` into it for the
exporter to check. It drops the arrays (views first keep the imports open), runs
gpurt.ipc_collect() (which counts the exporter's importers down) and prints "OK" last. Any
failure prints why and exits non-zero.
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np

import gpurt
from gpurt._ipc import counter


def main(folder: Path, count: int) -> None:
    arrays = []
    for i in range(count):
        handle = gpurt.ipc.IpcHandle.from_bytes((folder / f"handle{i}.bin").read_bytes())
        expected = np.load(folder / f"expected{i}.npy").view(
            np.dtype(getattr(gpurt, (folder / f"dtype{i}.txt").read_text())))
        array = gpurt.ipc.open_array(handle)
        assert array.shape == expected.shape, (array.shape, expected.shape)
        assert array.dtype == expected.dtype, (array.dtype, expected.dtype)
        got = array.to_numpy()
        assert np.array_equal(got, expected), f"handle {i}: the imported values differ"
        array.copy_((expected.astype(np.float64) * 2 + 1).astype(expected.dtype))
        arrays.append(array)
        if i == 0:  # a second open of the same export: still one importer to the exporter
            again = gpurt.ipc.open_array(handle)
            assert np.array_equal(again.to_numpy(), array.to_numpy()), "two opens differ"
            del again
            gpurt.ipc_collect()
            path = counter.path_of(handle.pid, handle.token)
            assert Path(path).read_bytes() == (1).to_bytes(8, "little"), "counted down early"
    gpurt.synchronize()
    views = [a[..., :1] for a in arrays]  # views keep the import open after the root dies
    del arrays
    gpurt.ipc_collect()
    assert all(v.to_numpy().size for v in views)
    del views
    gpurt.ipc_collect()
    print("OK")


if __name__ == "__main__":
    try:
        main(Path(sys.argv[1]), int(sys.argv[2]))
    except Exception as exc:  # the parent reads the reason from stdout
        print(f"FAILED {type(exc).__name__}: {exc}")
        sys.exit(1)
