"""When softmax_pipe (kernels/softmax_pipe.cu: a thread-block cluster per row, each cluster
walking rows with two stages in shared memory) stands in for ticket chunks. Pure Python, so
it is tested on any machine; measurements in benchmarks/notes_softmax.md (v18)."""

from __future__ import annotations

import dataclasses

from ._softmax_plan import _STORAGE_BYTES, MAX_CLUSTER, Variant

__all__ = ["PipeShape", "PIPE_SHAPES", "pipe_variant"]


@dataclasses.dataclass(frozen=True)
class PipeShape:
    """softmax_pipe's CTAs: ``threads``, ``items`` vectors of each input a thread (all in
    shared memory, two stages), ``blocks`` CTAs per multiprocessor, ``mode`` the
    Variant.pipe mode; it stands in for ticket chunks whose launch has at most ``waves``
    times as many CTAs as fit at once, where a cluster of at most ``most`` of its CTAs holds
    the row."""

    threads: int
    items: int
    blocks: int = 1
    mode: int = 1
    waves: float = 1.0
    most: int = MAX_CLUSTER


# (op, storage bytes) -> the shapes to try, in order. Empty: ticket chunks everywhere.
PIPE_SHAPES: dict[tuple[int, int], tuple[PipeShape, ...]] = {}


def pipe_variant(ticket: Variant, rows: int, cols: int, resident: int) -> Variant | None:
    """softmax_pipe in place of the ``ticket`` variant's launch of ``rows`` x ``cols`` when
    ``resident`` of its CTAs fit at once: the first PIPE_SHAPES shape that applies (the
    launch's size; a cluster that holds the row), or None."""
    if ticket.kind != "ticket" or ticket.vec * _STORAGE_BYTES[ticket.dtype] != 16:
        return None
    for shape in PIPE_SHAPES.get((ticket.op, _STORAGE_BYTES[ticket.dtype]), ()):
        if ticket.grid(rows, cols) > shape.waves * resident:
            continue
        columns = shape.threads * shape.items * ticket.vec
        ctas = 1 << max(0, (-(-cols // columns) - 1).bit_length())
        if 2 <= ctas <= shape.most:
            return Variant("cluster", ticket.dtype, ticket.op, ticket.vec, shape.items,
                           shape.threads, shape.threads, ctas, shape.blocks, shape.items,
                           ticket.edges, ticket.one_pass, pipe=shape.mode)
    return None
