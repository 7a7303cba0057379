"""The C++ compiler AOTInductor links a package's model library with: libstdc++ must be shared.

Why this module exists: on the H200 image (torch 2.11+cu130, Ubuntu), g++ linked libstdc++
*statically* into every AOTInductor model library (no ``libstdc++.so.6`` among its
``DT_NEEDED`` entries). Loaded into a torch process, which already has the shared
libstdc++, such a library runs with two copies of the C++ runtime whose symbols are
partly interposed by the shared one: its constructor's ``std::regex`` (``parse_device_str``)
read a facet of one copy's ``std::locale`` through the other's ids and crashed with
SIGSEGV, for every package, CPU or CUDA, even one convolution
(``benchmarks/aoti_load_probe.py`` + ``native_backtrace.c``, docs/measurements/).

So, before compiling: link a tiny shared library with torch's compiler and read its
``DT_NEEDED``. If the shared libstdc++ is missing, AOTInductor gets a wrapper compiler that
adds ``-l:libstdc++.so.6`` to shared-library links: named before the driver's own
``-lstdc++``, the shared library defines every C++ runtime symbol first and the static
archive supplies nothing. After compiling, ``check_package_libraries`` reads the package's
libraries, so a package that would crash the process that loads it is never written.
"""

from __future__ import annotations

import contextlib
import shlex
import subprocess
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from runtime_py.errors import BundleError
from runtime_py.native_libs import (SHARED_LIBSTDCXX, needed_libraries, needs_shared_libstdcxx,
                                    package_libraries, static_cxx_runtime_libraries)

#: Added to shared-library links by the wrapper compiler.
LINK_SHARED_LIBSTDCXX = f"-l:{SHARED_LIBSTDCXX}"
#: A translation unit that needs the C++ runtime library itself (not only inline templates).
PROBE_SOURCE = """#include <locale>
#include <string>
extern "C" int trt_bundle_probe() { return (int) std::locale::classic().name().size(); }
"""
WRAPPER_SCRIPT = """#!/bin/sh
# trt-bundle: {real} with libstdc++ linked as a shared library (bundler/targets/torch_aoti/toolchain.py)
case " $* " in
  *" -shared "*) exec {real} "$@" {flag} ;;
esac
exec {real} "$@"
"""


@dataclass(frozen=True)
class Toolchain:
    """What AOTInductor compiles with: ``compiler`` None means torch's own choice."""

    compiler: str | None
    description: str


def links_shared_libstdcxx(compiler: str, workdir: Path) -> bool:
    """Does ``compiler -shared`` make a library that needs the shared libstdc++?"""
    source, library = workdir / "probe.cpp", workdir / "probe.so"
    source.write_text(PROBE_SOURCE)
    library.unlink(missing_ok=True)
    try:
        proc = subprocess.run([*shlex.split(compiler), "-shared", "-fPIC", "-o", str(library),
                               str(source)], capture_output=True, text=True)
    except OSError as exc:
        raise BundleError(f"the C++ compiler AOTInductor uses ({compiler}) does not run: {exc}; "
                          "install g++ or set CXX to a working C++ compiler") from None
    if proc.returncode != 0:
        raise BundleError(f"the C++ compiler AOTInductor uses ({compiler}) could not link a "
                          f"one-function shared library: {proc.stderr.strip()[-400:]}; "
                          "install g++ or set CXX to a working C++ compiler")
    return needs_shared_libstdcxx(needed_libraries(library.read_bytes()))


def write_wrapper(compiler: str, directory: Path) -> Path:
    """A compiler that is ``compiler`` plus ``-l:libstdc++.so.6`` on shared links.

    It keeps the compiler's base name: Inductor picks its flags by the name (``g++`` is gcc).
    """
    words = shlex.split(compiler)   # a CXX may carry options, as torch allows
    path = directory / Path(words[0]).name
    path.write_text(WRAPPER_SCRIPT.format(real=shlex.join(words), flag=LINK_SHARED_LIBSTDCXX))
    path.chmod(0o755)
    return path


def torch_compiler() -> str:
    from torch._inductor import cpp_builder

    return cpp_builder.get_cpp_compiler()


@contextlib.contextmanager
def aoti_toolchain(compiler: str | None = None) -> Iterator[Toolchain]:
    """Within the block, AOTInductor links model libraries against the shared libstdc++.

    ``compiler``: the one to check (default: the one torch's Inductor would use).
    """
    real = compiler or torch_compiler()
    with tempfile.TemporaryDirectory(prefix="trt-bundle-cxx-") as tmp:
        work = Path(tmp)
        if links_shared_libstdcxx(real, work):
            yield Toolchain(None, f"{real}")
            return
        wrapper = write_wrapper(real, work)
        if not links_shared_libstdcxx(str(wrapper), work):
            raise BundleError(
                f"the C++ compiler AOTInductor uses ({real}) links libstdc++ statically, even "
                f"with {LINK_SHARED_LIBSTDCXX}; a package built so crashes the process that "
                "loads it. Install the shared libstdc++ development files (libstdc++-dev) or "
                "set CXX to a compiler that links it as a shared library")
        from torch._inductor import config

        with config.patch({"cpp.cxx": (None, str(wrapper))}):
            yield Toolchain(str(wrapper), f"{real} {LINK_SHARED_LIBSTDCXX} (it linked "
                                          "libstdc++ statically by default)")


def check_package_libraries(package: Path) -> list[str]:
    """Raise unless every shared library in the package needs the shared libstdc++.

    Returns the libraries' names. A package without one (``package_cpp_only``) passes.
    """
    static = static_cxx_runtime_libraries(package)
    if static:
        name, needed = next(iter(static.items()))
        raise BundleError(
            f"the package's library {name} does not link the shared libstdc++ (needs: "
            f"{', '.join(needed) or 'nothing'}): loading it next to torch crashes "
            "(bundler/targets/torch_aoti/toolchain.py). Rebuild with a compiler that links "
            "libstdc++ as a shared library")
    return list(package_libraries(package))
