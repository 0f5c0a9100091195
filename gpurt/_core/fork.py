"""The one at-fork registry: what a child forked after CUDA started must forget, in order.

A child forked after its parent initialised CUDA cannot use the parent's contexts, memory or
handles. Each layer registers one step under a name of :data:`ORDER`; after a fork the child
runs the registered steps in that order. The driver's step comes first: it decides whether
this is such a child (gpurt._core.driver.is_forked_child), and the later steps ask it.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import Any

__all__ = ["ORDER", "at_fork_in_child", "renew_after_fork"]

ORDER = (
    "driver",  # marks the child (gpurt/_core/driver.py)
    "devices",  # per-thread device state and primary contexts (gpurt/device.py)
    "allocators",  # the device memory allocators (gpurt/memory.py)
    "array places",  # the allocators new arrays reach (gpurt/_array/ownership.py)
    "ipc",  # the parent's exports and imports of device memory (gpurt/ipc.py)
)

_steps: dict[str, Callable[[], None]] = {}
_renewals: list[Callable[[], None]] = []


def at_fork_in_child(step: str, hook: Callable[[], None]) -> None:
    """Run ``hook`` in every forked child, as the step ``step`` of :data:`ORDER`."""
    if step not in ORDER:
        raise ValueError(f"unknown at-fork step {step!r}; the steps are {ORDER}")
    if step in _steps:
        raise ValueError(f"the at-fork step {step!r} is registered already")
    _steps[step] = hook


def renew_after_fork(owner: Any, **factories: Callable[[], Any]) -> None:
    """In a forked child, replace each lock ``name`` of ``owner`` (a module's globals() or
    an object that lives as long as the process) by ``factories[name]()``, before any step
    runs: a lock that another thread of the parent held at the fork would stay held forever
    in the child (only the forking thread lives on)."""

    def renew() -> None:
        for name, factory in factories.items():
            if isinstance(owner, dict):
                owner[name] = factory()
            else:
                setattr(owner, name, factory())

    _renewals.append(renew)


def _after_fork_in_child() -> None:
    for renew in _renewals:
        renew()
    for step in ORDER:
        hook = _steps.get(step)
        if hook is not None:
            hook()


os.register_at_fork(after_in_child=_after_fork_in_child)
