"""A synthetic memory-history snapshot in gpurt.memory._snapshot()'s format, for rendering
tests and for looking at the pictures without a GPU.

A toy training loop over a toy caching allocator: weights allocated before recording began,
per-step activations and temporaries, one leak per step from ``keep_history`` (2 MiB) and a
small one from ``log_stats``, an OOM followed by empty_cache, and one block whose free is
still pending at the end. ``python tests/data/synthetic_snapshot.py OUT.json`` writes it.
"""

from __future__ import annotations

import json
import random
import sys
from typing import Any

KiB, MiB = 1024, 1024 * 1024
INTERNAL = "/opt/venv/lib/python3.12/site-packages/gpurt/memory.py"
USER = "/home/me/project/train.py"


def frames(name: str, line: int) -> list[dict[str, Any]]:
    """A stack, innermost first: gpurt's allocator, then the user's code."""
    return [
        {"filename": INTERNAL, "line": 211, "name": "caching_allocator_alloc"},
        {"filename": USER, "line": line, "name": name},
        {"filename": USER, "line": 140, "name": "train_step"},
        {"filename": USER, "line": 201, "name": "main"},
    ]


class ToyAllocator:
    """Just enough of a caching allocator to produce believable events."""

    def __init__(self) -> None:
        self.segments: list[dict[str, Any]] = []
        self.live: dict[int, dict[str, Any]] = {}
        self.trace: list[dict[str, Any]] = []
        self.recording = False
        self.time_us = 1_000_000.0
        self.next_base = 0x7F3A00000000
        self.rng = random.Random(7)

    def _event(self, action: str, addr: int, size: int, stack: list[dict[str, Any]]) -> None:
        self.time_us += self.rng.uniform(5, 120)
        if self.recording:
            self.trace.append({"action": action, "addr": addr, "size": size, "stream": 0,
                               "time_us": round(self.time_us, 1), "frames": stack})

    def malloc(self, size: int, stack: list[dict[str, Any]]) -> int:
        size = max(512, (size + 511) // 512 * 512)
        small = size <= MiB
        for seg in self.segments:
            if seg["small"] != small:
                continue
            for i, (start, length) in enumerate(seg["free"]):
                if length >= size:
                    seg["free"][i] = (start + size, length - size)
                    return self._hand_out(start, size, seg, stack)
        if small:
            seg_size = 2 * MiB
        else:
            seg_size = 20 * MiB if size < 10 * MiB else -(-size // (2 * MiB)) * 2 * MiB
        seg = {"address": self.next_base, "size": seg_size, "small": small,
               "free": [(self.next_base, seg_size)]}
        self.next_base += seg_size + 0x200000
        self.segments.append(seg)
        self._event("segment_alloc", seg["address"], seg_size, stack)
        return self.malloc(size, stack)

    def _hand_out(self, addr: int, size: int, seg: dict[str, Any],
                  stack: list[dict[str, Any]]) -> int:
        self.live[addr] = {"size": size, "segment": seg, "frames": stack,
                           "state": "active_allocated"}
        self._event("alloc", addr, size, stack)
        return addr

    def free(self, addr: int, complete: bool = True) -> None:
        block = self.live[addr]
        self._event("free_requested", addr, block["size"], block["frames"])
        if not complete:
            block["state"] = "active_pending_free"
            return
        del self.live[addr]
        seg = block["segment"]
        spans = sorted(seg["free"] + [(addr, block["size"])])
        merged: list[tuple[int, int]] = []
        for start, length in spans:
            if merged and merged[-1][0] + merged[-1][1] == start:
                merged[-1] = (merged[-1][0], merged[-1][1] + length)
            elif length:
                merged.append((start, length))
        seg["free"] = merged
        self._event("free_completed", addr, block["size"], block["frames"])

    def oom(self, size: int, stack: list[dict[str, Any]]) -> None:
        self._event("oom", 0, size, stack)

    def empty_cache(self) -> None:
        self._event("empty_cache", 0, 0, [])
        for seg in list(self.segments):
            if seg["free"] == [(seg["address"], seg["size"])]:
                self.segments.remove(seg)
                self._event("segment_free", seg["address"], seg["size"], [])

    def snapshot(self) -> dict[str, Any]:
        segments = []
        for seg in self.segments:
            blocks = [{"address": a, "size": b["size"], "requested_size": b["size"],
                       "state": b["state"], "frames": b["frames"]}
                      for a, b in sorted(self.live.items()) if b["segment"] is seg]
            blocks += [{"address": s, "size": n, "requested_size": 0, "state": "inactive",
                        "frames": []} for s, n in seg["free"]]
            used = sum(b["size"] for b in blocks if b["state"] != "inactive")
            segments.append({
                "device": 0, "address": seg["address"], "total_size": seg["size"],
                "allocated_size": used, "active_size": used, "requested_size": used,
                "stream": 0, "segment_type": "small" if seg["small"] else "large",
                "segment_pool_id": [0, 0], "blocks": sorted(blocks, key=lambda b: b["address"]),
            })
        return {"segments": segments, "device_traces": [self.trace]}


def make_snapshot(steps: int = 6, seed: int = 0) -> dict[str, Any]:
    """The snapshot of the toy program; the same for the same arguments."""
    rng = random.Random(seed)
    alloc = ToyAllocator()
    for layer in range(3):  # before recording: the weights
        alloc.malloc(12 * MiB, frames("load_weights", 31 + layer))
    alloc.recording = True
    history = []
    for step in range(steps):
        activations = []
        for _layer in range(4):
            activations.append(alloc.malloc(rng.choice([3, 4, 6]) * MiB, frames("forward", 52)))
            temps = [alloc.malloc(rng.choice([64, 128, 256, 512]) * KiB, frames("attention", 67))
                     for _ in range(3)]
            for t in reversed(temps):
                alloc.free(t)
        history.append(alloc.malloc(2 * MiB, frames("keep_history", 88)))
        history.append(alloc.malloc(128 * KiB, frames("log_stats", 95)))
        grads = alloc.malloc(8 * MiB, frames("backward", 110))
        for a in reversed(activations):
            alloc.free(a)
        alloc.free(grads)
        if step == steps // 2:
            scratch = alloc.malloc(30 * MiB, frames("compute_loss", 124))
            alloc.free(scratch)
            alloc.oom(80 * 1024 * MiB, frames("forward", 52))
            alloc.empty_cache()
    pending = alloc.malloc(1 * MiB, frames("copy_to_host", 150))
    alloc.free(pending, complete=False)
    return alloc.snapshot()


if __name__ == "__main__":
    with open(sys.argv[1], "w") as fh:
        json.dump(make_snapshot(), fh, indent=None)
