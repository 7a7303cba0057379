"""Which shared libraries a native library needs (ELF ``DT_NEEDED``), and whether an
AOTInductor package's libraries use the shared C++ runtime.

Why the runtime reads this: an AOTInductor model library that links libstdc++ statically
crashes the process that loads it next to torch (SIGSEGV in its constructor's
``std::regex``, seen on the H200 image; ``bundler/targets/torch_aoti/toolchain.py`` has the
story). Reading ``DT_NEEDED`` from the package's bytes names that cause before any load,
without binutils and without loading anything.
"""

from __future__ import annotations

import os
import struct
import zipfile
from pathlib import Path

from runtime_py.errors import BundleError

SHARED_LIBSTDCXX = "libstdc++.so.6"


def needed_libraries(data: bytes) -> list[str]:
    """``DT_NEEDED`` entries of a 64-bit little-endian ELF shared object, from its bytes.

    Read through the program headers (``PT_DYNAMIC``, ``PT_LOAD``), which is what the dynamic
    loader reads, rather than the section table, which a stripped library may lack.
    BundleError for anything else, truncated or malformed files included.
    """
    if data[:4] != b"\x7fELF" or data[4:6] != b"\x02\x01":
        raise BundleError("not a 64-bit little-endian ELF file")
    try:
        return _dt_needed(data)
    except (struct.error, IndexError, ValueError, UnicodeDecodeError) as exc:
        raise BundleError(f"malformed ELF file ({exc})") from None


def _dt_needed(data: bytes) -> list[str]:
    phoff, = struct.unpack_from("<Q", data, 0x20)
    phentsize, phnum = struct.unpack_from("<HH", data, 0x36)
    loads, dynamic = [], None
    for i in range(phnum):
        p_type, _flags, offset, vaddr, _paddr, filesz, _memsz, _align = struct.unpack_from(
            "<IIQQQQQQ", data, phoff + i * phentsize)
        if p_type == 1:
            loads.append((vaddr, offset, filesz))
        elif p_type == 2:
            dynamic = (offset, filesz)
    if dynamic is None:
        return []

    def file_offset(address: int) -> int:
        for vaddr, offset, filesz in loads:
            if vaddr <= address < vaddr + filesz:
                return address - vaddr + offset
        raise BundleError(f"ELF address {address:#x} is outside the file's segments")

    needed, strtab = [], None
    for pos in range(dynamic[0], dynamic[0] + dynamic[1], 16):
        tag, value = struct.unpack_from("<qQ", data, pos)
        if tag == 0:
            break
        if tag == 1:
            needed.append(value)
        elif tag == 5:
            strtab = file_offset(value)
    if strtab is None:
        return []
    return [data[strtab + n:data.index(b"\0", strtab + n)].decode() for n in needed]


def needs_shared_libstdcxx(needed: list[str]) -> bool:
    return any(name.startswith("libstdc++.so") for name in needed)


def package_libraries(package: str | os.PathLike) -> dict[str, list[str]]:
    """Each shared library in an AOTInductor package (a zip) -> its ``DT_NEEDED`` list."""
    with zipfile.ZipFile(Path(package)) as archive:
        return {os.path.basename(info.filename): needed_libraries(archive.read(info))
                for info in archive.infolist() if info.filename.endswith(".so")}


def static_cxx_runtime_libraries(package: str | os.PathLike) -> dict[str, list[str]]:
    """The package's libraries that do not need the shared libstdc++ (name -> DT_NEEDED)."""
    return {name: needed for name, needed in package_libraries(package).items()
            if not needs_shared_libstdcxx(needed)}
