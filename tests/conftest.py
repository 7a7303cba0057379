"""Shared fixtures. Sections are owned by topic (prefix in the fixture name)."""

import fcntl
import json
import os
import shutil
import subprocess
from contextlib import contextmanager
from pathlib import Path

import pytest

from runtime_py.compat import usable_cores
from runtime_py.engines.onnxruntime import THREADS_ENV as ORT_THREADS_ENV

# Tests must never reach a model hub.
os.environ.setdefault("HF_HUB_OFFLINE", "1")


def threads_per_worker() -> int:
    """The cores this process may use, shared among the run's xdist workers."""
    return max(1, usable_cores() // int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1")))


def pytest_configure(config):
    """Each process that runs tests gets its share of the cores for torch (OpenMP, read when
    torch is imported: set here, before collection imports it) and for ONNX Runtime
    (trt-bundle's ``THREADS_ENV``); subprocesses (CLI runs, servers) inherit both. Left at
    their defaults, each of the README's two workers ran a thread per core of both on 2
    cores, and the spinning threads took CPU from the other worker: two workers running
    test_runtime_bundles.py side by side took 122 s each, 96 s with one thread each. Not in
    xdist's controller, which runs no tests: its environment is the workers', and a value
    set there would stand for theirs. A value the caller set is kept."""
    if getattr(config.option, "numprocesses", None) and not hasattr(config, "workerinput"):
        return
    share = str(threads_per_worker())
    os.environ.setdefault("OMP_NUM_THREADS", share)
    os.environ.setdefault(ORT_THREADS_ENV, share)


# --- parallel runs (pytest-xdist, the README's `-n 2 --dist loadgroup`) -----------------
#: Test files that create or list segments in /dev/shm (Triton shared-memory clients, the
#: region registry, Ray's object store, the serve command's no-leftover check, the serving
#: benchmarks' client processes: their queues' semaphores are named there): one group, so
#: one worker runs them one after another and a listing never sees another file's
#: segments (tests/test_parallel_groups.py finds them).
DEV_SHM_FILES = frozenset({
    "test_serve_triton.py", "test_shm_registry.py", "test_pinned_host.py", "test_grpc_h2.py",
    "test_grpc_wire.py", "test_ray_serve.py", "test_stat_held.py",
    "test_fuzz_protocols.py",   # registers a segment of its own
    "test_serve_bench_repeats.py", "test_serve_pair_bench.py",   # forkserver clients
    "test_torch_aoti.py"})   # its GPU test of a client's region


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(config, items):
    """Every test gets an ``xdist_group``: its file's, or "dev-shm" (above). Under
    ``--dist loadgroup`` a group runs on one worker, so a module's fixtures (compiled
    packages, built bundles) are made once, as in a serial run. Marked before xdist
    reads the marks (tryfirst); a serial run ignores them."""
    for item in items:
        if item.get_closest_marker("xdist_group"):
            continue
        name = item.path.name
        item.add_marker(pytest.mark.xdist_group("dev-shm" if name in DEV_SHM_FILES else name))


# --- caches: one set per test run, removed with it --------------------------------------
@pytest.fixture(scope="session", autouse=True)
def run_caches(tmp_path_factory):
    """The export cache (``TRT_BUNDLE_CACHE``) and Inductor's compile cache
    (``TORCHINDUCTOR_CACHE_DIR``) of this run, under pytest's run folder.

    Without it the suite wrote ~/.cache/trt-bundle and /tmp/torchinductor_root, which
    outlive the run and grow with each torch version: a run on a reused machine then saw
    warm caches a clean CI machine does not have, and the disk filled up (CI failed with
    ENOSPC). Both xdist workers share the export cache (its writes are atomic); each has
    an Inductor cache of its own, because Inductor writes a C++ object or library in place
    under a name keyed by its code: two workers compiling the same code (most likely the
    tiny model's CPU package, built in test_torch_aoti and in test_aoti_toolchain) can
    have one load the other's half-written file ("not a 64-bit little-endian ELF file",
    once, a fresh-machine run of 2026-12-06). Subprocesses inherit the variables. A green run's folder is deleted at the
    end (``tmp_path_retention_policy = "failed"``). Inductor's precompiled headers (~0.7 GB)
    stay in /tmp/torchinductor_$USER: torch fixes that path at import, keyed by compiler,
    flags and header contents, so later runs reuse them."""
    base = tmp_path_factory.getbasetemp()
    worker = os.environ.get("PYTEST_XDIST_WORKER")
    run_folder = base.parent if worker else base
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("TRT_BUNDLE_CACHE", str(run_folder / "trt-bundle-cache"))
        patch.setenv("TORCHINDUCTOR_CACHE_DIR",
                     str(run_folder / f"torchinductor-cache-{worker or 'main'}"))
        yield run_folder


# --- real bundles of the family, built once per session (slow part of the suite) -------
@contextmanager
def _run_lock(path: Path):
    """An exclusive lock on ``path`` between the run's xdist workers (one at a time builds
    what the run shares)."""
    with open(path, "a") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


@pytest.fixture(scope="session")
def xception_bundles(run_caches):
    """precision -> Path of a random-weights timm_xception bundle (onnxruntime target).

    Built with small calibration and reference sets to keep CI fast; the graphs are the
    real family graphs (43 FP8 convolutions for fp8). Built once per run, in the run
    folder: the first worker that needs them builds them under a lock, the other takes
    them (tests read them, never change them), which saves the run three builds of
    xception (about 45 s of CPU).
    """
    from bundler.make import MakeRequest, make_bundle

    out = run_caches / "xception_bundles"
    listing = out / "bundles.json"
    with _run_lock(run_caches / "xception_bundles.lock"):
        if listing.is_file():
            return {precision: Path(path)
                    for precision, path in json.loads(listing.read_text()).items()}
        shutil.rmtree(out, ignore_errors=True)       # a build that failed in another worker
        out.mkdir()
        bundles = {}
        for precision in ("fp32", "fp16", "fp8"):
            result = make_bundle(MakeRequest(
                family="timm_xception", precision=precision, backend="onnxruntime",
                random_weights=True, out_dir=out, calib_count=16, reference_count=4))
            bundles[precision] = result.path
        listing.write_text(json.dumps({precision: str(path)
                                       for precision, path in bundles.items()}))
    return bundles


# --- graphs_ fixtures (bundler.export / bundler.graphs): built once per session ---------
import pytest as _graphs_pytest


@_graphs_pytest.fixture(scope="session")
def graphs_family():
    from bundler.families import load_family

    return load_family("timm_xception")


@_graphs_pytest.fixture(scope="session")
def graphs_state_dict(graphs_family):
    """Seeded random weights (non-trivial BatchNorm statistics), unfolded."""
    from bundler.torch_model import random_state_dict

    return random_state_dict(graphs_family, seed=0)


@_graphs_pytest.fixture(scope="session")
def graphs_torch_model(graphs_family, graphs_state_dict):
    from bundler.torch_model import build_torch_model

    return build_torch_model(graphs_family, graphs_state_dict)


@_graphs_pytest.fixture(scope="session")
def graphs_export_cache(run_caches):
    """The run's, not the worker's: both workers read the one export (writes are atomic)."""
    folder = run_caches / "graphs_export_cache"
    folder.mkdir(exist_ok=True)
    return folder


@_graphs_pytest.fixture(scope="session")
def graphs_fp32(graphs_torch_model, graphs_family, graphs_export_cache):
    from bundler.export import export_fp32_onnx

    return export_fp32_onnx(graphs_torch_model, graphs_family, cache_dir=graphs_export_cache)


@_graphs_pytest.fixture(scope="session")
def graphs_fp16(graphs_fp32):
    from bundler.graphs.fp16 import to_fp16

    return to_fp16(graphs_fp32)


@_graphs_pytest.fixture(scope="session")
def graphs_run():
    """run(model, x) -> first output, with ONNX Runtime CPU (sessions cached per model)."""
    import onnxruntime as ort

    sessions = {}

    def run(model, x, outputs=None):
        key = id(model)
        if key not in sessions:
            options = ort.SessionOptions()
            options.log_severity_level = 3
            sessions[key] = (model, ort.InferenceSession(
                model.SerializeToString(), options, providers=["CPUExecutionProvider"]))
        session = sessions[key][1]
        result = session.run(outputs, {session.get_inputs()[0].name: x})
        return result if outputs is not None else result[0]

    return run


@_graphs_pytest.fixture(scope="session")
def graphs_inputs():
    """Two evaluation images (one uniform noise, one smooth structured pattern) in the
    preprocessed range [-1, 1], and two different calibration images."""
    import numpy as np

    rng = np.random.default_rng(1234)
    yy, xx = np.meshgrid(np.linspace(-1, 1, 299), np.linspace(-1, 1, 299), indexing="ij")
    structured = np.stack([np.sin(3 * xx), np.cos(5 * yy), xx * yy]).astype(np.float32)
    evaluation = np.stack([rng.uniform(-1, 1, (3, 299, 299)).astype(np.float32), structured])
    calibration = np.stack([
        rng.uniform(-1, 1, (3, 299, 299)).astype(np.float32),
        np.clip(structured[::-1] + rng.normal(0, 0.2, (3, 299, 299)), -1, 1).astype(np.float32),
    ])
    return {"eval": evaluation, "calib": calibration}


@_graphs_pytest.fixture(scope="session")
def graphs_selected(graphs_fp32, graphs_family):
    from bundler.graphs.fp8 import select_fp8_layers

    return select_fp8_layers(graphs_fp32, graphs_family)


@_graphs_pytest.fixture(scope="session")
def graphs_max_scales(graphs_fp32, graphs_fp16, graphs_inputs):
    """scales(selected) -> per-tensor max/448 over the calibration images, read from the
    fp32 graph (the real calibrators live in bundler.calibration; this is the simplest
    stand-in)."""
    import numpy as np
    import onnx
    import onnxruntime as ort

    from bundler.graphs.fp8 import E4M3_MAX, quantized_activation_tensors

    def scales(selected):
        tensors = quantized_activation_tensors(graphs_fp16, selected)
        probe = onnx.ModelProto()
        probe.CopyFrom(graphs_fp32)
        for name in tensors:
            probe.graph.output.append(
                onnx.helper.make_tensor_value_info(name, onnx.TensorProto.FLOAT, None))
        session = ort.InferenceSession(probe.SerializeToString(),
                                       providers=["CPUExecutionProvider"])
        values = session.run(tensors, {"input": graphs_inputs["calib"]})
        return {name: float(np.abs(v).max()) / E4M3_MAX for name, v in zip(tensors, values)}

    return scales


@_graphs_pytest.fixture(scope="session")
def graphs_act_scales(graphs_max_scales, graphs_selected):
    return graphs_max_scales(graphs_selected)


@_graphs_pytest.fixture(scope="session")
def graphs_weight_scales(graphs_fp32, graphs_selected):
    from bundler.graphs.fp8 import compute_weight_scales

    return compute_weight_scales(graphs_fp32, graphs_selected)


@_graphs_pytest.fixture(scope="session")
def graphs_fp8(graphs_fp16, graphs_selected, graphs_act_scales, graphs_weight_scales):
    from bundler.graphs.fp8 import to_fp8

    return to_fp8(graphs_fp16, graphs_selected, graphs_act_scales, graphs_weight_scales)


@_graphs_pytest.fixture(scope="session")
def graphs_fp32_outputs(graphs_fp32, graphs_inputs, graphs_run):
    return graphs_run(graphs_fp32, graphs_inputs["eval"])


# --- cpp_ fixtures: the C++ reader (cpp_stub) built once per session under ASan + UBSan ---
_CPP = Path(__file__).resolve().parent.parent / "cpp_stub"


#: What the C++ reader's build needs from the system (.ci/run installs the same list).
CPP_SYSTEM_PACKAGES = ("cmake", "g++", "libzstd-dev", "libmsgpuck-dev", "libssl-dev")


def _unavailable(reason: str):
    if os.environ.get("BUNDLE_CPP_REQUIRED") == "1":
        pytest.fail(f"cpp_stub cannot be built: {reason}")
    pytest.skip(f"cpp_stub cannot be built: {reason} (Debian/Ubuntu: apt-get install "
                f"{' '.join(CPP_SYSTEM_PACKAGES)}, as .ci/run does)")


@pytest.fixture(scope="session")
def inspect_cpp(tmp_path_factory) -> Path:
    """Path of bundle-inspect-cpp built with BUNDLE_SANITIZE=ON in a temporary build dir."""
    cmake = shutil.which("cmake")
    if not cmake:
        _unavailable("cmake not found on PATH (Debian: apt-get install cmake)")
    if not (shutil.which("c++") or shutil.which("g++") or shutil.which("clang++")):
        _unavailable("no C++ compiler on PATH (Debian: apt-get install g++)")
    build = tmp_path_factory.mktemp("cpp_stub_build")
    conf = subprocess.run(
        [cmake, "-S", str(_CPP), "-B", str(build), "-DBUNDLE_SANITIZE=ON", "-DBUNDLE_TRT=OFF",
         "-DCMAKE_BUILD_TYPE=Debug"], capture_output=True, text=True)
    if conf.returncode != 0:
        lines = [ln for ln in (conf.stdout + conf.stderr).splitlines() if ln.strip()]
        _unavailable("CMake configure failed (missing libraries? cpp_stub/README.md lists the "
                     "Debian packages): " + " | ".join(lines[-6:]))
    jobs = str(max(2, os.cpu_count() or 2))
    built = subprocess.run([cmake, "--build", str(build), "-j", jobs, "--target", "bundle-inspect-cpp"],
                           capture_output=True, text=True)
    assert built.returncode == 0, f"cpp_stub build failed:\n{built.stdout[-4000:]}\n{built.stderr[-4000:]}"
    exe = build / "bundle-inspect-cpp"
    assert exe.is_file()
    return exe
