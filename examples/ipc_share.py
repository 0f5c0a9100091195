"""Share a gpurt Array with another process on the same machine (docs/ipc.md).

The parent exports an array; a child started with multiprocessing's "spawn" method (CUDA
does not survive fork) receives the handle through a queue, opens the same device memory,
doubles it in place and closes; the parent sees the result, then gives the block back with
gpurt.ipc_collect().

    python examples/ipc_share.py
"""

from __future__ import annotations

import multiprocessing as mp
from typing import Any

import numpy as np

import gpurt


def child(handles: Any, replies: Any) -> None:
    handle = handles.get()  # a gpurt.ipc.IpcHandle: pickled by value, validated on arrival
    array = gpurt.ipc.open_array(handle)  # same shape, dtype and device as the parent's
    array.copy_(array.to_numpy() * 2)
    gpurt.synchronize()
    del array
    gpurt.ipc_collect()  # close now: the parent may give the block back
    replies.put("doubled")


def main() -> None:
    context = mp.get_context("spawn")
    handles, replies = context.Queue(), context.Queue()
    process = context.Process(target=child, args=(handles, replies))
    process.start()
    x = gpurt.from_numpy(np.arange(12, dtype=np.float32).reshape(3, 4))
    handles.put(gpurt.ipc.export_array(x[:, 1:3]))  # views share too
    print(replies.get(timeout=60))
    process.join(timeout=60)
    print(x.to_numpy())
    expected = np.arange(12, dtype=np.float32).reshape(3, 4)
    expected[:, 1:3] *= 2
    assert np.array_equal(x.to_numpy(), expected)
    gpurt.ipc_collect()  # the child closed: the export's hold on the block ends
    print("PASS" if process.exitcode == 0 else f"FAIL: child exit code {process.exitcode}")


if __name__ == "__main__":
    main()
