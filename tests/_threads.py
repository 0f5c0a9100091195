"""A helper shared by the tests: run a function in a fresh thread and hand back its result."""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any


def in_thread(fn: Callable[[], Any]) -> Any:
    """Run ``fn`` in a new thread and return its result (or raise its exception)."""
    out: dict[str, Any] = {}

    def run() -> None:
        try:
            out["value"] = fn()
        except BaseException as exc:  # noqa: BLE001  (handed back to the test thread)
            out["error"] = exc

    worker = threading.Thread(target=run)
    worker.start()
    worker.join(30)
    assert not worker.is_alive(), "thread did not finish"
    if "error" in out:
        raise out["error"]
    return out.get("value")
