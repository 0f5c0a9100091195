"""The lowest layer of device memory: the driver backend under the caching core (the one
cuMemAlloc/cuMemFree caller), and the driver helpers the allocators share.

Every driver result goes through :func:`gpurt._core.driver.check`; the only codes looked at
directly are CUDA_ERROR_OUT_OF_MEMORY (the caching core retries, then raises),
CUDA_ERROR_NOT_READY from cuEventQuery (not an error), CUDA_ERROR_STREAM_CAPTURE_IMPLICIT
from cuStreamGetCaptureInfo (the legacy stream, which no capture includes) and a failed
cuEventRecord on a stream gpurt does not own (its owner destroyed it: synchronize instead).
"""

from __future__ import annotations

from typing import Any

from cuda.bindings import driver as cu

from .._core.driver import OutOfMemoryError, check
from .._streams.handles import in_host_callback
from ..device import bind_context, primary_context

__all__: list[str] = []

_OOM = int(cu.CUresult.CUDA_ERROR_OUT_OF_MEMORY)
_NOT_READY = int(cu.CUresult.CUDA_ERROR_NOT_READY)
_RELAXED = cu.CUstreamCaptureMode.CU_STREAM_CAPTURE_MODE_RELAXED
_NO_TIMING = int(cu.CUevent_flags.CU_EVENT_DISABLE_TIMING)
_IMPLICIT = int(cu.CUresult.CUDA_ERROR_STREAM_CAPTURE_IMPLICIT)
_CAPTURE_ACTIVE = int(cu.CUstreamCaptureStatus.CU_STREAM_CAPTURE_STATUS_ACTIVE)


def out_of_memory_error(message: str, call: str) -> OutOfMemoryError:
    """gpurt.OutOfMemoryError whose str() is ``message`` (torch-like text)."""
    err = OutOfMemoryError(_OOM, "CUDA_ERROR_OUT_OF_MEMORY", message, call)
    err.args = (message,)
    return err


def event_query(event: Any) -> bool:
    """True when the work before ``event`` has completed (wraps cuEventQuery)."""
    result = cu.cuEventQuery(event)
    if int(result[0]) == _NOT_READY:
        return False
    check(result, "cuEventQuery")
    return True


class relaxed_capture_mode:
    """Switch this thread to relaxed stream-capture mode for a call that a global-mode
    capture elsewhere would forbid (wraps cuThreadExchangeStreamCaptureMode)."""

    def __enter__(self) -> None:
        self.previous = check(cu.cuThreadExchangeStreamCaptureMode(_RELAXED),
                              "cuThreadExchangeStreamCaptureMode")

    def __exit__(self, *exc: object) -> None:
        check(cu.cuThreadExchangeStreamCaptureMode(self.previous),
              "cuThreadExchangeStreamCaptureMode")


class DriverBackend:
    """Segments from cuMemAlloc (expandable ones from cuMemAddressReserve and cuMemCreate
    pages), events from cuEventCreate, for one device."""

    def __init__(self, index: int) -> None:
        self.index = index
        self._pages: dict[int, Any] = {}  # expandable segments: page address -> handle

    def malloc(self, size: int, capturing: bool, stream: int = 0) -> int | None:
        bind_context(self.index)
        if capturing:
            with relaxed_capture_mode():
                result = cu.cuMemAlloc(size)
        else:
            result = cu.cuMemAlloc(size)
        if int(result[0]) == _OOM:
            return None
        return int(check(result, "cuMemAlloc"))

    def free(self, ptr: int) -> None:
        bind_context(self.index)
        check(cu.cuMemFree(ptr), "cuMemFree")

    def mem_get_info(self) -> tuple[int, int]:
        bind_context(self.index)
        free, total = check(cu.cuMemGetInfo(), "cuMemGetInfo")
        return int(free), int(total)

    def event_create(self) -> Any:
        bind_context(self.index)
        return check(cu.cuEventCreate(_NO_TIMING), "cuEventCreate")

    def event_record(self, event: Any, stream: int) -> None:
        bind_context(self.index)
        check(cu.cuEventRecord(event, stream), "cuEventRecord")

    def event_query(self, event: Any) -> bool:
        bind_context(self.index)
        return event_query(event)

    def event_synchronize(self, event: Any) -> None:
        check(cu.cuEventSynchronize(event), "cuEventSynchronize")

    def event_destroy(self, event: Any) -> None:
        check(cu.cuEventDestroy(event), "cuEventDestroy")

    def synchronize(self) -> None:
        bind_context(self.index)
        check(cu.cuCtxSynchronize(), "cuCtxSynchronize")

    def may_record_events(self) -> bool:
        """Not on the driver's callback thread, and this device's context is the current one
        (wraps cuCtxGetCurrent): a free, perhaps run by a finalizer between another call's
        context bind and its driver call, must not bind a context of its own."""
        if in_host_callback():
            return False
        current = check(cu.cuCtxGetCurrent(), "cuCtxGetCurrent")
        return int(current) == int(primary_context(self.index))

    def capture_id(self, stream: int) -> int | None:
        """Id of the capture sequence ``stream`` is part of (wraps cuStreamGetCaptureInfo,
        whose first outputs are the status and the id in cuda-bindings 12 and 13 alike)."""
        bind_context(self.index)
        result = cu.cuStreamGetCaptureInfo(stream)
        if int(result[0]) == _IMPLICIT:  # the legacy stream, while a blocking one captures
            return None
        status, capture_id = check(result, "cuStreamGetCaptureInfo")[:2]
        return int(capture_id) if int(status) == _CAPTURE_ACTIVE else None

    def oom_error(self, message: str) -> BaseException:
        return out_of_memory_error(message, "cuMemAlloc")

    # ---- expandable segments (virtual memory management) ------------------------------

    def reserve(self, size: int) -> int | None:
        """Address space for an expandable segment, aligned as the driver likes (alignment
        0, as torch; a 20 MiB alignment is not a power of two and is refused) (wraps
        cuMemAddressReserve)."""
        bind_context(self.index)
        result = cu.cuMemAddressReserve(size, 0, 0, 0)
        if int(result[0]) == _OOM:
            return None
        return int(check(result, "cuMemAddressReserve"))

    def map(self, ptr: int, size: int, page: int, capturing: bool = False) -> bool:
        """Back [ptr, ptr + size) with new pages (wraps cuMemCreate, cuMemMap and
        cuMemSetAccess); False, with nothing left behind, when the device is full."""
        bind_context(self.index)
        if capturing:
            with relaxed_capture_mode():
                return self._map(ptr, size, page)
        return self._map(ptr, size, page)

    def _map(self, ptr: int, size: int, page: int) -> bool:
        made: list[tuple[int, Any]] = []
        mapped: list[int] = []
        try:
            for address in range(ptr, ptr + size, page):
                result = cu.cuMemCreate(page, self._page_properties(), 0)
                if int(result[0]) == _OOM:
                    break
                made.append((address, check(result, "cuMemCreate")))
            else:
                for address, handle in made:
                    check(cu.cuMemMap(address, page, 0, handle, 0), "cuMemMap")
                    mapped.append(address)
                check(cu.cuMemSetAccess(ptr, size, [self._access()], 1), "cuMemSetAccess")
                for address, handle in made:
                    self._pages[address] = handle
                return True
        except BaseException:
            self._undo(mapped, made, page)
            raise
        self._undo(mapped, made, page)
        return False

    def _undo(self, mapped: list[int], made: list[tuple[int, Any]], page: int) -> None:
        for address in mapped:
            check(cu.cuMemUnmap(address, page), "cuMemUnmap")
        for _, handle in made:
            check(cu.cuMemRelease(handle), "cuMemRelease")

    def unmap(self, ptr: int, size: int, page: int) -> None:
        """Wait for the device (unmapping does not), then unmap and free the pages
        (wraps cuCtxSynchronize, cuMemUnmap and cuMemRelease)."""
        self.synchronize()
        for address in range(ptr, ptr + size, page):
            check(cu.cuMemUnmap(address, page), "cuMemUnmap")
            check(cu.cuMemRelease(self._pages.pop(address)), "cuMemRelease")

    def unreserve(self, ptr: int, size: int) -> None:
        """Give back an expandable segment's address space (wraps cuMemAddressFree)."""
        bind_context(self.index)
        check(cu.cuMemAddressFree(ptr, size), "cuMemAddressFree")

    def page_handle(self, ptr: int) -> Any:
        """The cuMemCreate handle of the page that starts at ``ptr`` (for export)."""
        return self._pages[ptr]

    def _page_properties(self) -> Any:
        """Pinned device memory that can be exported as a POSIX file descriptor (for
        sharing with other processes, as torch's expandable segments)."""
        prop = cu.CUmemAllocationProp()
        prop.type = cu.CUmemAllocationType.CU_MEM_ALLOCATION_TYPE_PINNED
        prop.location.type = cu.CUmemLocationType.CU_MEM_LOCATION_TYPE_DEVICE
        prop.location.id = self.index
        prop.requestedHandleTypes = (
            cu.CUmemAllocationHandleType.CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR)
        return prop

    def _access(self) -> Any:
        desc = cu.CUmemAccessDesc()
        desc.location.type = cu.CUmemLocationType.CU_MEM_LOCATION_TYPE_DEVICE
        desc.location.id = self.index
        desc.flags = cu.CUmemAccess_flags.CU_MEM_ACCESS_FLAGS_PROT_READWRITE
        return desc
