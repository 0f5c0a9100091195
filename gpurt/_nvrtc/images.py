"""What a file of device code is: cubin, PTX, fatbin or LTO-IR, and which GPUs it is for.

Everything here reads untrusted bytes (a file a user hands to ``gpurt.load_module``, an
entry of a prebuilt archive): every read is bounds-checked, sizes are capped, and nothing
raises but ValueError. No GPU is needed: :func:`describe` and :func:`check_runs_on` are
plain Python, so the checks are tested on any machine.
"""

from __future__ import annotations

import dataclasses
import errno
import os
import re
import stat
import struct

__all__ = ["Image", "MAX_IMAGE_BYTES", "describe", "check_runs_on", "read_file", "arch_number"]

MAX_IMAGE_BYTES = 1 << 30  # the largest file of device code gpurt loads (fatbins run to MBs)

_ELF = b"\x7fELF"
_EM_CUDA = 190
_ET_REL, _ET_EXEC = 1, 2
_FATBIN_MAGIC = 0xBA55ED50
_LTOIR_MAGIC = b"\xedCN\x7f"  # NVVM's LTO-IR wrapper (0x7F4E43ED, little-endian)
_FATBIN_KINDS = {1: "ptx", 2: "cubin", 8: "ltoir"}
_FATBIN_ARCH_SPECIFIC = 0x100000  # entry flag of sm_XXa code
_FATBIN_COMPRESSED = 0x2000 | 0x8000
_MAX_FATBIN_ENTRIES = 4096
_PTX_TARGET = re.compile(rb"^\s*\.target\s+(sm_\d+[af]?)", re.M)
_PTX_VERSION = re.compile(rb"^\s*\.version\s+\d+\.\d+", re.M)
_ARCH = re.compile(r"^(?:sm|compute|lto)_(\d+)([af]?)$")


@dataclasses.dataclass(frozen=True)
class Image:
    """A file of device code: ``kind`` ('cubin', 'ptx', 'fatbin', 'ltoir'); ``archs`` the
    architectures it holds code for ('sm_90' cubins, 'compute_90' PTX; empty where the
    format does not say, LTO-IR); ``relocatable``: a cubin of relocatable code (-rdc) that
    must be linked before it can run; ``members``: a fatbin's uncompressed cubins."""

    kind: str
    archs: tuple[str, ...]
    relocatable: bool = False
    members: tuple[bytes, ...] = ()


def arch_number(arch: str) -> tuple[int, str]:
    """(90, 'a') for 'sm_90a'; ValueError for a string that names no architecture."""
    match = _ARCH.match(arch)
    if match is None:
        raise ValueError(f"invalid architecture {arch!r}: expected e.g. sm_90, sm_90a, compute_90")
    return int(match.group(1)), match.group(2)


def describe(data: bytes, what: str = "the data") -> Image:
    """The :class:`Image` in ``data``; ValueError naming ``what`` when it is none of the four
    kinds, is cut short, or is larger than MAX_IMAGE_BYTES."""
    if len(data) > MAX_IMAGE_BYTES:
        raise ValueError(f"{what} is {len(data)} bytes, over the limit of {MAX_IMAGE_BYTES}")
    try:
        if data[:4] == _ELF:
            return _describe_elf(data, what)
        if data[:4] == _FATBIN_MAGIC.to_bytes(4, "little"):
            return _describe_fatbin(data, what)
    except struct.error:
        raise ValueError(f"{what} is cut short (a truncated cubin or fatbin)") from None
    if data[:4] == _LTOIR_MAGIC:
        return Image("ltoir", ())
    head = bytes(data[:1 << 16])
    if b"\0" not in head.rstrip(b"\0") and _PTX_VERSION.search(head):
        targets = _PTX_TARGET.findall(head)
        return Image("ptx", tuple(t.decode().replace("sm_", "compute_") for t in targets[:1]))
    raise ValueError(f"{what} is not device code gpurt can load: expected a cubin (ELF), "
                     f"PTX text, a fatbin or LTO-IR; it starts with {bytes(data[:8])!r}")


def _describe_elf(data: bytes, what: str) -> Image:
    """A CUDA ELF: 64-bit little-endian, machine EM_CUDA; its sm from e_flags."""
    if len(data) < 64 or data[4] != 2 or data[5] != 1:
        raise ValueError(f"{what} is an ELF file but not a 64-bit little-endian one")
    kind, machine = struct.unpack_from("<HH", data, 0x10)
    if machine != _EM_CUDA:
        raise ValueError(f"{what} is an ELF file for another machine (e_machine {machine}), "
                         "not a CUDA cubin")
    if kind not in (_ET_REL, _ET_EXEC):
        raise ValueError(f"{what} is a CUDA ELF file of type {kind}, neither code nor an object")
    flags, = struct.unpack_from("<I", data, 0x30)
    sm = (flags >> 8) & 0xFF if data[8] >= 8 else flags & 0xFF  # ABI version 8: CUDA 13
    shoff, = struct.unpack_from("<Q", data, 0x28)
    shentsize, shnum = struct.unpack_from("<HH", data, 0x3A)
    if shoff + shnum * shentsize > len(data):
        raise ValueError(f"{what} is cut short: its section table lies past its end")
    return Image("cubin", (f"sm_{sm}",) if sm else (), relocatable=kind == _ET_REL)


def _describe_fatbin(data: bytes, what: str) -> Image:
    """A fatbin: a 16-byte header, then entries (kind, header size, payload size, arch)."""
    _, _, header, size = struct.unpack_from("<IHHQ", data, 0)
    if header < 16 or header + size > len(data):
        raise ValueError(f"{what} is a fatbin cut short ({len(data)} bytes of {header + size})")
    archs: list[str] = []
    members: list[bytes] = []
    at, end = header, header + size
    while at < end:
        if len(archs) >= _MAX_FATBIN_ENTRIES:
            raise ValueError(f"{what} has more than {_MAX_FATBIN_ENTRIES} fatbin entries")
        kind, _, entry_header, payload = struct.unpack_from("<HHIQ", data, at)
        arch, = struct.unpack_from("<I", data, at + 0x1C)
        flags, = struct.unpack_from("<I", data, at + 0x28)
        if entry_header < 0x2C or at + entry_header + payload > end:
            raise ValueError(f"{what}: fatbin entry at byte {at} runs past the fatbin's end")
        name = _FATBIN_KINDS.get(kind)
        if name is not None:
            prefix = {"ptx": "compute", "cubin": "sm", "ltoir": "lto"}[name]
            suffix = "a" if flags & _FATBIN_ARCH_SPECIFIC else ""
            archs.append(f"{prefix}_{arch}{suffix}")
            if name == "cubin" and not flags & _FATBIN_COMPRESSED:
                members.append(bytes(data[at + entry_header: at + entry_header + payload]))
        at += entry_header + payload
    return Image("fatbin", tuple(dict.fromkeys(archs)), members=tuple(members))


def _runs(code_arch: str, device: tuple[int, str]) -> bool:
    """Whether code for ``code_arch`` runs on a device of architecture ``device``: a cubin
    on the same major version and a minor at least its own (sm_XXa/f: that exact one, or
    the family), PTX on the same architecture or any later one (JIT-compiled by the driver)."""
    number, suffix = arch_number(code_arch)
    device_number, _ = device
    if code_arch.startswith("compute_"):
        return device_number >= number if not suffix else device_number == number
    if code_arch.startswith("lto_"):
        return False
    if suffix == "a":
        return device_number == number
    return device_number // 10 == number // 10 and device_number >= number


def check_runs_on(image: Image, device_arch: str, what: str = "the code") -> None:
    """ValueError naming the image's architectures and the device's when none of its code
    can run there. Images that do not say (LTO-IR, cubins without an sm) pass: the driver
    or the linker decides."""
    if not image.archs:
        return
    device = arch_number(device_arch)
    if any(_runs(arch, device) for arch in image.archs):
        return
    raise ValueError(f"{what} holds code for {', '.join(image.archs)}, none of which runs on "
                     f"this device ({device_arch}); build it for {device_arch} (e.g. "
                     f"gpurt compile --arch {device_arch}) or include PTX of an older "
                     "architecture")


def read_file(path: str | os.PathLike[str], limit: int = MAX_IMAGE_BYTES) -> bytes:
    """The bytes of the regular file ``path``, at most ``limit`` of them: opened without
    following a link in its last component and without blocking (a FIFO), checked with
    fstat. ValueError when it is not such a file; OSError when it cannot be opened."""
    flags = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC
    try:
        fd = os.open(path, flags)
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            raise ValueError(f"{os.fspath(path)} is a symbolic link; pass the file it "
                             "points to") from exc
        raise
    with os.fdopen(fd, "rb") as fh:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            raise ValueError(f"{os.fspath(path)} is not a regular file")
        if info.st_size > limit:
            raise ValueError(f"{os.fspath(path)} has {info.st_size} bytes, over the limit "
                             f"of {limit}")
        data = fh.read(limit + 1)
    if len(data) > limit:
        raise ValueError(f"{os.fspath(path)} grew over the limit of {limit} bytes")
    return data
