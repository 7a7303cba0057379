"""bundler.targets.torch_aoti.toolchain: AOTInductor libraries link the shared libstdc++.

The H200 image's compiler linked libstdc++ statically into every AOTInductor library, and
every package then crashed the process that loaded it. Here a compiler that does the same
is a two-line script around the host's g++ (`-static-libstdc++` on shared links).
"""

from __future__ import annotations

import io
import shutil
import subprocess
import zipfile
from pathlib import Path

import numpy as np
import pytest

from runtime_py.errors import BundleError

GXX = shutil.which("g++")
pytestmark = pytest.mark.skipif(GXX is None, reason="needs g++ (AOTInductor compiles C++ with it)")

STATIC_COMPILER = """#!/bin/sh
case " $* " in *" -shared "*) exec {gxx} "$@" -static-libstdc++ ;; esac
exec {gxx} "$@"
"""


@pytest.fixture(scope="module")
def static_gxx(tmp_path_factory) -> str:
    """A `g++` that links libstdc++ statically into shared libraries, as the H200 image's did."""
    folder = tmp_path_factory.mktemp("static-cxx")
    path = folder / "g++"
    path.write_text(STATIC_COMPILER.format(gxx=GXX))
    path.chmod(0o755)
    return str(path)


def _library(tmp_path: Path, compiler: str, name: str) -> bytes:
    from bundler.targets.torch_aoti.toolchain import PROBE_SOURCE

    source = tmp_path / f"{name}.cpp"
    source.write_text(PROBE_SOURCE)
    out = tmp_path / f"{name}.so"
    subprocess.run([compiler, "-shared", "-fPIC", "-o", str(out), str(source)], check=True)
    return out.read_bytes()


def test_needed_libraries_reads_dt_needed(tmp_path, static_gxx):
    from runtime_py.native_libs import needed_libraries

    shared = needed_libraries(_library(tmp_path, GXX, "shared"))
    static = needed_libraries(_library(tmp_path, static_gxx, "static"))
    assert "libstdc++.so.6" in shared
    assert not any(name.startswith("libstdc++") for name in static)
    readelf = shutil.which("readelf")
    if readelf:   # the same list the binutils tool prints
        out = subprocess.run([readelf, "-d", str(tmp_path / "shared.so")], capture_output=True,
                             text=True, check=True).stdout
        assert shared == [line.split("[")[1].rstrip("]") for line in out.splitlines()
                          if "(NEEDED)" in line]
    with pytest.raises(BundleError, match="not a 64-bit little-endian ELF"):
        needed_libraries(b"#!/bin/sh\n")
    with pytest.raises(BundleError, match="not a 64-bit little-endian ELF"):
        needed_libraries(b"\x7fELF")
    data = (tmp_path / "shared.so").read_bytes()
    for cut in (64, 200):   # the ELF header only; part of the program headers
        with pytest.raises(BundleError, match="malformed ELF"):
            needed_libraries(data[:cut])


def test_the_compiler_check_tells_static_from_shared(tmp_path, static_gxx):
    from bundler.targets.torch_aoti.toolchain import links_shared_libstdcxx

    assert links_shared_libstdcxx(GXX, tmp_path)
    assert not links_shared_libstdcxx(static_gxx, tmp_path)
    with pytest.raises(BundleError, match="could not link a one-function shared library"):
        links_shared_libstdcxx(f"{GXX} --no-such-option", tmp_path)
    with pytest.raises(BundleError, match="does not run"):
        links_shared_libstdcxx(str(tmp_path / "no-such-g++"), tmp_path)


def test_a_static_compiler_gets_the_wrapper_a_shared_one_is_kept(tmp_path, static_gxx):
    from torch._inductor import config

    from bundler.targets.torch_aoti.toolchain import (LINK_SHARED_LIBSTDCXX, aoti_toolchain,
                                                links_shared_libstdcxx)

    before = config.cpp.cxx
    with aoti_toolchain(GXX) as toolchain:
        assert toolchain.compiler is None and toolchain.description == GXX
        assert config.cpp.cxx == before
    with aoti_toolchain(static_gxx) as toolchain:
        wrapper = toolchain.compiler
        assert Path(wrapper).name == "g++"      # Inductor picks gcc flags by the name
        assert config.cpp.cxx == (None, wrapper)
        assert links_shared_libstdcxx(wrapper, tmp_path)
        assert toolchain.description.startswith(static_gxx)
        assert LINK_SHARED_LIBSTDCXX in toolchain.description
    assert config.cpp.cxx == before
    assert not Path(wrapper).exists()           # a private temporary folder, removed
    spaced = tmp_path / "a folder" / "g++"      # a compiler path with a space, and options
    spaced.parent.mkdir()
    shutil.copy(static_gxx, spaced)
    with aoti_toolchain(f"'{spaced}' -O1") as toolchain:
        assert links_shared_libstdcxx(toolchain.compiler, tmp_path)


def _zip(members: dict[str, bytes]) -> bytes:
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w") as archive:
        for name, data in members.items():
            archive.writestr(name, data)
    return buf.getvalue()


def test_a_package_with_a_static_cxx_runtime_is_refused(tmp_path, static_gxx):
    from bundler.targets.torch_aoti.toolchain import check_package_libraries

    good, bad = _library(tmp_path, GXX, "good"), _library(tmp_path, static_gxx, "bad")
    folder = "model/data/aotinductor/model/"
    ok = tmp_path / "ok.pt2"
    ok.write_bytes(_zip({folder + "a.wrapper.so": good, folder + "a.cubin": b"\0"}))
    assert check_package_libraries(ok) == ["a.wrapper.so"]
    broken = tmp_path / "broken.pt2"
    broken.write_bytes(_zip({folder + "b.wrapper.so": bad}))
    with pytest.raises(BundleError, match="b.wrapper.so does not link the shared libstdc"):
        check_package_libraries(broken)
    code_only = tmp_path / "code.pt2"
    code_only.write_bytes(_zip({folder + "a.wrapper.cpp": b"int x;"}))
    assert check_package_libraries(code_only) == []


@pytest.mark.slow
def test_a_package_compiled_with_a_static_compiler_loads(tmp_path, static_gxx):
    """End to end: the compiler that broke every package on the H200 image now gives one
    that loads and computes (before the fix, loading raised std::bad_cast here and crashed
    with SIGSEGV there)."""
    import torch

    from bundler.targets.torch_aoti import build_engine
    from runtime_py.engines.torch_aoti import TorchAotiRunner
    from test_torch_aoti import _MemoryBundle, _tiny_model

    # torch's own patch context, not monkeypatch: on torch 2.14 undoing a setattr on an
    # Inductor config leaves the setting hidden for every later test in the process.
    model = _tiny_model()
    with torch._inductor.config.patch({"cpp.cxx": (None, static_gxx)}):
        package, details = build_engine(model, "fp32", (3, 16, 16), {"min": 1, "max": 2},
                                        device="cpu", batch_sizes=[2])
    assert "-l:libstdc++.so.6" in details["compile_options"]["cxx"]
    x = np.random.default_rng(0).normal(size=(2, 3, 16, 16)).astype(np.float32)
    with TorchAotiRunner(_MemoryBundle("fp32", details, package, (3, 16, 16), 10, 2)) as runner:
        got = runner.infer({"input": x})["logits"]
    assert np.abs(got - model(torch.from_numpy(x)).numpy()).max() < 1e-4


def test_the_runtime_names_a_static_cxx_runtime_before_loading(tmp_path, static_gxx):
    """A package whose library links libstdc++ statically (made by another tool, or an older
    trt-bundle): the runtime says so before any load; `auto` falls back to the ONNX graph."""
    import runtime_py
    from runtime_py.errors import CompatibilityError
    from test_torch_aoti import _aoti_bundle_with

    package = _zip({"model/data/aotinductor/model/m.wrapper.so":
                    _library(tmp_path, static_gxx, "static")})
    path = _aoti_bundle_with(tmp_path, package)
    with pytest.raises(CompatibilityError, match="m.wrapper.so links libstdc.. statically"):
        runtime_py.load(path, backend="torch-aoti")
    with runtime_py.load(path) as model:
        assert model.runner.backend == "onnxruntime"
        assert "links libstdc++ statically" in model.fallback_reason
