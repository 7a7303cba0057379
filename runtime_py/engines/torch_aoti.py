"""torch-aoti runner: load the bundle's AOTInductor package and run it on a CUDA stream.

Design:

* ``activate`` imports torch (only here: importing ``runtime_py`` never needs it), checks
  the manifest's record of the package against this host (``check_torch_aoti_target``
  in ``torch_aoti_compat.py``: torch major.minor, CUDA major, compute capability)
  *before* loading, then writes ``engine.pt2`` to a private temporary folder
  (torch's package loader takes a path; the package unpickles nothing), loads it and
  deletes the folder. Each graph is loaded by torch's own loader without the host survey
  that ``aoti_load_package`` adds (``aoti_load.py``: 27 of 36 s on torch 2.11) and without
  importing ``torch._inductor`` for its wrapper (5-6 s more): 5.0 s in all on an H100.
* Before loading in this process: the package's libraries must need the shared
  libstdc++ (``check_cxx_runtime``: one linked statically crashed every load on the H200
  image, torch 2.11), then the package is loaded once in a child process
  (``PackageLoadCheck``; ``load_check=False`` or ``TRT_BUNDLE_AOTI_LOAD_CHECK=0`` skips
  it): torch's native loader can crash the process instead of raising, and a service,
  `bundle verify` or `bundle study` should get a CompatibilityError that names it, and
  `backend="auto"` its fallback to ONNX Runtime, rather than die. It costs one torch
  import and one load (10.8 s of a 21-s activation on an H100 before the two changes
  above), so the child starts as soon as the package is on disk, before this process
  imports torch and sets up its device, and is waited for only before the graphs load
  here (a 0.5-s wait of a 5.0-s activation).
* Three non-blocking streams per runner (copy-in, compute, copy-out) and two batch slots
  (``_Slot``: device input, device output, pinned output, pinned staging), so that two
  batches are in flight: ``infer_async`` enqueues H2D on the copy-in stream, a device copy
  into the graph's static input + the engine + a device copy of the output on the compute
  stream, and D2H on the copy-out stream, ordered by events; the copy-in of batch k+1 and
  the copy-out of batch k-1 overlap the compute of batch k. ``Pending.result()`` waits for
  the slot's last event only. A slot is reused only after its previous Pending was resolved.
* How ``Pending.result()`` waits (``event_sync``): "block" (default: the slot's ``done``
  event is made with ``cudaEventBlockingSync``, the waiting thread sleeps until the GPU
  signals) or "spin" (the CUDA driver polls the event: a core busy for as long as the wait
  lasts). Serving the uint8 xception pair on the H200 (docs/measurements/h200-2026-12-03),
  "block" took the batcher's completion thread from 0.68-0.98 cores to 0.07-0.09 and the
  engine process from 1.3-1.7 cores to 0.6-0.8, with img/s equal or better on every path
  (HTTP fp8 9,018 vs 8,832, fp16 7,605 vs 7,573; gRPC 6,481 vs 6,436, 5,963 vs 5,802).
  ``infer`` (a caller that waits at once) synchronizes its stream, not this event.
* Enqueueing a batch makes no call that gives the GIL away (``enqueue = "held"``,
  default): where the feed lies in pinned memory and the batch size's CUDA graph is
  captured, the copies, event records and waits and the graph launch go through
  ``cudart_held`` (the process's CUDA runtime via ctypes.PyDLL) instead of a dozen torch
  calls, each of which released the GIL and waited up to 5 ms to get it back from a
  serving process's event loop. Elsewhere (the first batch of a size, a feed not in
  pinned memory, no runtime library found, ``enqueue = "torch"``) the torch calls run.
* Feeds that lie in pinned memory from ``input_buffers()`` are copied to the device in
  place; any other array goes through the CUDA driver's pageable copy (``staging =
  "pageable"``) or is first copied into the slot's pinned staging buffer, split over
  threads (``staging = "pinned"``, ``runtime_py.hostcopy.copy_rows``), each chunk's H2D
  copy enqueued as soon as that chunk is copied: at most one host copy either way.
  ``staging = "auto"`` (default) stages a batch below ``PARALLEL_MIN_BYTES`` (one
  memcpy) and leaves a larger one to the driver: on the H200's host one thread copies
  ~11.5 GB/s and the driver's pageable copy of 8.6 MB (0.62 ms) beat every split of it.
* ``infer`` (a caller that waits) runs on the compute stream alone, and once its size's
  graph is captured it enqueues through ``cudart_held`` as well (``_infer_held``), for
  a pinned feed or a plain one that is staged.
* CUDA graphs (``cuda_graphs=True``, default): captured the first time a batch size is
  seen, after one warm-up run on that size (first runs allocate workspace and load
  kernels, which must not be captured). The package is loaded with
  ``run_single_threaded=True``, which AOTInductor provides for graph capture. A batch
  size whose capture fails runs plainly afterwards, recorded in ``graph_failures``.
  Where the manifest says so (``engine.details.compile_options.cudnn_benchmark``,
  family.json ``torch_aoti.cudnn_benchmark``: true, or the batch sizes whose graphs do,
  ``cudnn_timed_sizes``), that warm-up runs with ``torch.backends.cudnn.benchmark`` on
  (``timed_cudnn_algorithms``): cuDNN times its algorithms for each convolution and the
  graph captures the fastest; the flag is put back after the warm-up, and other sizes
  and sizes that run without a graph keep cuDNN's heuristic.
* Static-batch graphs (manifest ``engine.details.static_batches``, family.json
  ``torch_aoti.static_batches``): the package holds, next to the dynamic-batch graph (its
  default model, ``DYNAMIC_MODEL``), one graph compiled for each listed batch size
  (``static_model_name``); a batch of exactly such a size runs on its graph (and its CUDA
  graph is captured from it), any other size on the dynamic one. Inductor gives a static
  graph kernels with fixed sizes, as ``torch.compile(dynamic=False)`` does.
* fp32 packages: TF32 is disabled for cuDNN and matmuls (process-wide torch flags; the
  fp32 tolerance of ``runtime_py.numerics`` assumes IEEE fp32, as TensorRT plans built
  without TF32 give).
"""

from __future__ import annotations

import contextlib
import importlib.util
import math
import os
import shutil
import signal
import site
import subprocess
import sys
import tempfile
import threading
import time
import zipfile
from pathlib import Path
from typing import Any, Iterator

import numpy as np

from runtime_py.compat import GpuInfo, HostInfo
from runtime_py.engines.aoti_load import DYNAMIC_MODEL, load_graphs
from runtime_py.engines.base import Runner, require_own_engine
from runtime_py.engines.torch_aoti_compat import check_torch_aoti_target
from runtime_py.errors import (BundleError, CompatibilityError, EngineUnavailableError,
                               UsageError)
from runtime_py.engines import cudart_held
from runtime_py import pinned_host
from runtime_py.hostcopy import (PARALLEL_MIN_BYTES, HostBufferRegistry, copy_held, copy_rows,
                                 gather_rows)
from runtime_py.graph_sizes import graph_batch, parse_graph_sizes
from runtime_py.pending import Pending, read_out
from runtime_py.staging import may_stage, rows_to_skip
from runtime_py.native_libs import static_cxx_runtime_libraries
from runtime_py.tensors import TensorSpec

MEMBER = "engine.pt2"
#: Batches in flight per runner (copy-in of the next and copy-out of the previous batch
#: overlap the compute of the current one).
SLOTS = 2


EVENT_SYNC_MODES = ("spin", "block")


def check_event_sync(mode: str) -> None:
    if mode not in EVENT_SYNC_MODES:
        raise UsageError(f"event_sync must be one of {', '.join(EVENT_SYNC_MODES)}, "
                         f"got {mode!r}")


def cudnn_timed_sizes(record: object) -> frozenset[int] | None:
    """Which graphs' warm-ups time cuDNN's algorithms, from its record (manifest
    ``compile_options.cudnn_benchmark``, family.json ``torch_aoti.cudnn_benchmark``): None
    for every size (true), none (false or absent), or the batch sizes listed (positive
    integers, each once). Why sizes: on an H100 timm_xception's fp16 graph of batch 32
    ran 4-5% faster with cuDNN's algorithms timed, its graphs of 1 to 24 0.4-9% slower
    (docs/measurements/h100-2026-12-07-i). ValueError for anything else."""
    if record is True:
        return None
    if record is False or record is None:
        return frozenset()
    if (isinstance(record, list) and record
            and all(type(n) is int and n > 0 for n in record)
            and len(set(record)) == len(record)):
        return frozenset(record)
    raise ValueError(f"expected true, false or a list of batch sizes, got {record!r}")


def cudnn_record(sizes: frozenset[int] | None) -> bool | list[int]:
    """``cudnn_timed_sizes`` turned back into the record: true for every size (None), false
    for none, else the batch sizes ascending. The one writer of the record's form: the
    build's manifest, the reuse check and the runner's ``cudnn_timing`` all call it."""
    return True if sizes is None else sorted(sizes) or False


@contextlib.contextmanager
def timed_cudnn_algorithms(torch, on: bool) -> Iterator[None]:
    """``torch.backends.cudnn.benchmark`` on inside (when ``on``), as it was after. Why: in
    timm_xception's fp16 graphs cuDNN's heuristic ran the 3-channel stem as an NCHW sgemm
    after a layout conversion; with its algorithms timed the fp16 bundle ran 4-5% faster
    at batch 32 on an H100, where timm_resnet50's ran 4% slower
    (docs/measurements/h100-2026-12-07-g), so it is a family's choice. The flag is
    process-wide: the runner sets it only for a graph's warm-up, under its lock. PyTorch
    keeps one plan per convolution (shape, strides, alignment) for timed and untimed
    calls alike: the capture after the warm-up reuses the timed plan, and a convolution
    already run untimed in the thread (another bundle's, the same shape) keeps its
    heuristic plan."""
    if not on:
        yield
        return
    before = torch.backends.cudnn.benchmark
    torch.backends.cudnn.benchmark = True
    try:
        yield
    finally:
        torch.backends.cudnn.benchmark = before


class _Slot:
    """The buffers and events of one batch in flight (see the module docstring)."""

    def __init__(self) -> None:
        self.host_in = self.host_out = self.device_in = self.device_out = None
        self.host_in_array: np.ndarray | None = None     # host_in's memory, as numpy
        self.staged = self.consumed = self.computed = self.done = None
        self.pending: Pending | None = None
        self._outputs: dict[int, tuple[Any, np.ndarray]] = {}
        # rows copied into device_in ahead of the slot's next batch (``stage_rows``), by
        # whom; when the slot is taken, what it held then (``staged_ahead``)
        self.staged_rows, self.staged_by = 0, None
        self.staged_ahead: tuple[int, object] = (0, None)

    def outputs(self, n: int) -> tuple[Any, np.ndarray]:
        """The first ``n`` rows of the pinned output, as a tensor and as the array over the
        same memory: made once per batch size (a slice and ``.numpy()`` per call cost
        microseconds that show at batch 1)."""
        views = self._outputs.get(n)
        if views is None:
            tensor = self.host_out[:n]
            views = self._outputs[n] = (tensor, tensor.numpy())
        return views


def _rows_after(pieces: list[np.ndarray], skip: int) -> list[np.ndarray]:
    """``pieces`` (arrays of rows, in order) without their first ``skip`` rows."""
    for i, piece in enumerate(pieces):
        if skip < piece.shape[0]:
            return ([piece[skip:]] if skip else [piece]) + pieces[i + 1:]
        skip -= piece.shape[0]
    return []


def static_model_name(batch: int) -> str:
    """The name, in the package, of the graph compiled for exactly ``batch`` (docs/format.md)."""
    return f"batch{int(batch)}"


TORCH_MISSING = ("this bundle's engine is an AOTInductor package, which needs torch: "
                 "pip install torch (the version in the manifest's engine.details), or run the "
                 "bundle's ONNX with `--backend onnxruntime`")


def import_torch():
    try:
        import torch
    except ImportError:
        raise EngineUnavailableError(TORCH_MISSING) from None
    return torch


def torch_host() -> HostInfo:
    """This host as torch sees it (versions and GPUs), for the compatibility check."""
    torch = import_torch()
    gpus: tuple[GpuInfo, ...] = ()
    notes: list[str] = []
    try:
        if torch.cuda.is_available():
            gpus = tuple(GpuInfo(torch.cuda.get_device_name(i), tuple(torch.cuda.get_device_capability(i)))
                         for i in range(torch.cuda.device_count()))
        else:
            notes.append(f"torch {torch.__version__} sees no CUDA device")
    except Exception as exc:  # a broken driver reads as "no GPU"
        notes.append(f"CUDA probe failed: {exc}")
    return HostInfo(gpus=gpus, torch_version=str(torch.__version__),
                    torch_cuda_version=torch.version.cuda, notes=tuple(notes))


def check_cxx_runtime(path: Path) -> None:
    """CompatibilityError when a library in the package links libstdc++ statically: it
    crashes the process that loads it next to torch (``runtime_py.native_libs``), so say so
    before any load, naming the library. Packages from ``bundle make`` never do (it checks)."""
    try:
        static = static_cxx_runtime_libraries(path)
    except (BundleError, zipfile.BadZipFile):
        return  # not this cause: an unreadable package is the loader's to report
    if static:
        name = next(iter(static))
        raise CompatibilityError(
            f"the bundle's AOTInductor library {name} links libstdc++ statically (it needs "
            f"no libstdc++.so), which crashes a process that loads it next to torch: rebuild "
            "the engine with this trt-bundle (`bundle rebuild BUNDLE --backend torch-aoti`), "
            "or run the bundle's ONNX graph (`--backend onnxruntime`, or `auto`)")


#: What the child process of ``PackageLoadCheck`` runs: argv = package, device,
#: single-threaded. It loads the dynamic graph as the runner does (``aoti_load``), not
#: through ``aoti_load_package``, whose host survey would add 27 s on torch 2.11.
LOAD_CHECK_CODE = """
import sys, torch
from pathlib import Path
from runtime_py.engines.aoti_load import DYNAMIC_MODEL, load_graphs
path, device, single = sys.argv[1], sys.argv[2], sys.argv[3] == "1"
kwargs = {}
if device != "cpu":
    torch.cuda.init()
    kwargs = {"device_index": int(device), "run_single_threaded": single}
load_graphs(torch, Path(path), [DYNAMIC_MODEL], **kwargs)
"""
LOAD_CHECK_TIMEOUT_S = 300


class PackageLoadCheck:
    """A test load of the package in a child process (``LOAD_CHECK_CODE``), started as soon
    as the package is on disk so that it runs while this process imports torch and sets up
    its device: on an H100 the check took 10.8 of a 21-s activation, ~4 s of which this
    process spends in the same imports; started early, its wait was 0.5 of 5.0 s
    (h100-2026-12-06-c). ``wait`` raises CompatibilityError where the load failed;
    ``cancel`` ends a check nobody waits for."""

    def __init__(self, path: Path, device: str, run_single_threaded: bool, *,
                 code: str = LOAD_CHECK_CODE, timeout_s: float = LOAD_CHECK_TIMEOUT_S) -> None:
        self.timeout_s = timeout_s
        self._deadline = time.monotonic() + timeout_s
        # a file, not a pipe: a child that fills a pipe nobody reads yet would stall
        self._stderr = tempfile.TemporaryFile(mode="w+", encoding="utf-8", errors="replace")
        self._proc = subprocess.Popen(
            [sys.executable, "-c", code, str(path), str(device),
             "1" if run_single_threaded else "0"],
            stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=self._stderr,
            env=child_env_with_runtime())

    def wait(self) -> None:
        """Return once the child loaded the package; else CompatibilityError telling a loader
        crash (a signal), a load that raised, and one past ``timeout_s`` apart."""
        torch = import_torch()
        what = f"torch {torch.__version__} could not load this bundle's AOTInductor package"
        remedy = ("run the bundle's ONNX graph (`--backend onnxruntime`, or `auto`, which "
                  "falls back to it), or rebuild the engine on this host (`bundle rebuild`)")
        try:
            self._proc.wait(timeout=max(0.0, self._deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            self.cancel()
            raise CompatibilityError(f"{what}: a test load in a child process did not finish "
                                     f"in {self.timeout_s:g} s; {remedy}") from None
        code = self._proc.returncode
        self._stderr.seek(0)
        stderr = self._stderr.read()
        self._stderr.close()
        if code == 0:
            return
        if code < 0:
            try:
                name = signal.Signals(-code).name
            except ValueError:
                name = f"signal {-code}"
            raise CompatibilityError(f"{what}: a test load in a child process was killed by "
                                     f"{name} (torch's native loader crashed); {remedy}")
        lines = [ln for ln in stderr.strip().splitlines() if ln.strip()]
        raise CompatibilityError(f"{what}: a test load in a child process failed "
                                 f"({lines[-1] if lines else f'exit status {code}'}); "
                                 f"{remedy}")

    def cancel(self) -> None:
        """Kill the child if it still runs and reap it (an activation that failed before
        waiting must leave no process behind)."""
        if self._proc.returncode is None:   # else waited for already
            self._proc.kill()
            self._proc.wait()
        self._stderr.close()


def probe_package_load(path: Path, device: str, run_single_threaded: bool, *,
                       code: str = LOAD_CHECK_CODE,
                       timeout_s: float = LOAD_CHECK_TIMEOUT_S) -> None:
    """Load the package at ``path`` in a child process and wait for it (``PackageLoadCheck``);
    CompatibilityError if that fails. ``device`` is "cpu" or a CUDA device index."""
    check = PackageLoadCheck(path, device, run_single_threaded, code=code, timeout_s=timeout_s)
    try:
        check.wait()
    finally:
        check.cancel()


def child_env_with_runtime() -> dict[str, str]:
    """This process's environment, for a child Python that imports this ``runtime_py`` (the
    load check's). Where the child would not find it by itself, its folder goes first on
    PYTHONPATH. A child inherits PYTHONPATH and the site folders, not this process's own
    ``sys.path`` entries (a script's folder, ``python -m``'s working folder, pytest's): one of
    those does not count. Where the folder is a site folder, nothing changes: putting
    site-packages ahead of the standard library could shadow a module of it."""
    env = dict(os.environ)
    root = Path(__file__).resolve().parents[2]
    inherited = [*env.get("PYTHONPATH", "").split(os.pathsep), *site.getsitepackages()]
    if site.ENABLE_USER_SITE:
        inherited.append(site.getusersitepackages())
    if any(entry and Path(entry).resolve() == root for entry in inherited):  # "": the cwd
        return env
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(root), env.get("PYTHONPATH")) if p)
    return env


class TorchAotiRunner(Runner):
    """Options: device (int, default 0), cuda_graphs (bool, default True), load_check
    (bool, default True unless TRT_BUNDLE_AOTI_LOAD_CHECK=0: ``PackageLoadCheck``),
    event_sync ("block", default, or "spin": how a batch's result is waited for, see the
    module docstring), cuda_graph_sizes (None, default: a graph per batch size; or the
    sizes that get one, a batch padded up to the next: ``runtime_py.graph_sizes``),
    cudnn_benchmark (None, default: as the bundle records it, ``cudnn_timed_sizes``; True
    or False: whether every graph's warm-up times cuDNN's algorithms or none,
    ``timed_cudnn_algorithms``)."""

    backend = "torch-aoti"

    def __init__(self, bundle, device: int = 0, cuda_graphs: bool = True,
                 load_check: bool | None = None, event_sync: str = "block",
                 cuda_graph_sizes=None, cudnn_benchmark: bool | None = None,
                 **options: object) -> None:
        super().__init__(bundle, device=device, cuda_graphs=cuda_graphs, **options)
        check_event_sync(event_sync)
        self.event_sync = event_sync
        self.cuda_graph_sizes = parse_graph_sizes(cuda_graph_sizes, self.max_batch_size)
        self.device_index = int(device)
        self.use_cuda_graphs = bool(cuda_graphs)
        if load_check is None:
            load_check = os.environ.get("TRT_BUNDLE_AOTI_LOAD_CHECK", "1") != "0"
        self.load_check = bool(load_check)
        #: the graphs' warm-ups time cuDNN's algorithms (``timed_cudnn_algorithms``): as
        #: the bundle records it, unless ``cudnn_benchmark`` says (`bundle serve
        #: --cudnn-benchmark on|off`: which pick is faster depends on the card too)
        details = bundle.manifest["engine"].get("details") or {}
        # (the batch sizes whose graphs time them, None: every size)
        self._cudnn_sizes: frozenset[int] | None
        if cudnn_benchmark is None:
            try:
                self._cudnn_sizes = cudnn_timed_sizes(
                    (details.get("compile_options") or {}).get("cudnn_benchmark"))
            except ValueError:      # a record this runtime does not know: not timed
                self._cudnn_sizes = frozenset()
        else:
            self._cudnn_sizes = None if cudnn_benchmark else frozenset()
        self.graph_failures: dict[int, str] = {}
        #: how a plain (not pinned) batch reaches the device: "pageable" (the CUDA
        #: driver's own staged copy of the caller's memory; blocks the caller until the
        #: bytes are on their way) or "pinned" (a threaded copy into the slot's pinned
        #: staging buffer, each chunk's async H2D enqueued once it is copied). H200,
        #: xception uint8 at batch 32, before the chunks overlapped their H2D: pageable
        #: 5.91 ms against 6.47 ms (fp16), 4.91 against 5.32 (fp8); equal at batch 1
        #: (docs/measurements/h200-2026-12-01-s3/serve-run6.log)
        #: "auto" (default): pinned for a batch below ``hostcopy.PARALLEL_MIN_BYTES`` (one
        #: memcpy, and ``infer`` then takes the held path), pageable above.
        self.staging = "auto"
        #: how a batch from pinned memory is enqueued: "held" (CUDA runtime calls that
        #: keep the GIL, where they can be made) or "torch" (torch's stream calls)
        self.enqueue = "held"
        self._lock = threading.Lock()
        self._reset()

    def _reset(self) -> None:
        self._torch = None
        self._model = None
        self._static_models: dict[int, Any] = {}    # batch -> its static graph
        self._device = None
        self._stream = None           # compute
        self._on_stream = None        # reusable contexts that make each one current
        self._on_in_stream = self._on_out_stream = None
        self._in_stream = None        # host -> device copies
        self._out_stream = None       # device -> host copies
        self._slots: list[_Slot] = []
        self._next_slot = 0
        self._pinned = HostBufferRegistry()
        self._static: dict[int, tuple[Any, Any]] = {}   # batch -> (input, output) on device
        self._graphs: dict[int, Any] = {}
        # batch -> (warm-up s, capture s) of each size's graph: a server's start captures
        # every size 1..max of each model (``prepare``); for the fp16 package of
        # timm_xception that took 73 s on an H100, nearly all of it the warm-ups
        # (docs/measurements/h100-2026-12-05-d)
        self.capture_seconds: dict[int, tuple[float, float]] = {}
        # phase -> seconds of the last activation, in the order they ran: loading the fp16
        # package of timm_xception took 36 s on an H100, a third of a server's start, and
        # nothing said where (docs/measurements/h100-2026-12-05-e); the phases showed 35 s
        # in "graphs", 27 s of it torch's CPU survey (h100-2026-12-06-b, aoti_load.py)
        self.load_seconds: dict[str, float] = {}
        self._graph_execs: dict[int, int | None] = {}   # batch -> raw cudaGraphExec_t
        self._graph_pool = None       # the memory pool every size's graph is captured into
        self._held: cudart_held.CudartHeld | None = None
        self._on_cpu = False

    @property
    def on_gpu(self) -> bool:
        return self.is_active and not self._on_cpu

    # -- activation -------------------------------------------------------------------
    def activate_impl(self) -> None:
        require_own_engine(self.bundle, "torch-aoti", "an AOTInductor package")
        details = self.bundle.manifest["engine"]["details"]
        self._on_cpu = details.get("device") == "cpu"
        if importlib.util.find_spec("torch") is None:   # before the package is written out
            raise EngineUnavailableError(TORCH_MISSING)
        folder = Path(tempfile.mkdtemp(prefix="trt-bundle-pt2-"))
        check = None
        try:
            mark = time.perf_counter()
            path = folder / MEMBER
            path.write_bytes(self.bundle.read_member(MEMBER))
            check_cxx_runtime(path)
            if self.load_check:   # its child runs while this process imports torch
                check = PackageLoadCheck(path, "cpu" if self._on_cpu else str(self.device_index),
                                         self.use_cuda_graphs)
            mark = self._phase_done("package member", mark)
            torch = import_torch()
            mark = self._phase_done("torch import", mark)
            check_torch_aoti_target(details, torch_host(), self.device_index)  # before loading
            self._phase_done("host check", mark)
            self._torch = torch
            try:
                self._activate(torch, path, check)
            except BaseException:
                self.deactivate_impl()
                raise
        finally:
            if check is not None:
                check.cancel()    # nothing to do once waited for
            shutil.rmtree(folder, ignore_errors=True)

    def _phase_done(self, phase: str, since: float) -> float:
        """Record ``phase`` as the seconds since ``since``; the mark the next one starts from."""
        now = time.perf_counter()
        self.load_seconds[phase] = now - since
        return now

    def _activate(self, torch, path: Path, check: PackageLoadCheck | None) -> None:
        """Device, streams and graphs; ``path`` is the package on disk, ``check`` its load
        check under way (None: off), waited for before this process loads it."""
        mark = time.perf_counter()
        if self.bundle.manifest["precision"] == "fp32":
            torch.backends.cudnn.allow_tf32 = False
            torch.backends.cuda.matmul.allow_tf32 = False
        if self._on_cpu:
            self._device = torch.device("cpu")
            self.use_cuda_graphs = False
        else:
            self._device = torch.device("cuda", self.device_index)
            torch.cuda.set_device(self._device)
            self._stream = torch.cuda.Stream(self._device)
            # one context object, entered under the lock on every batch: building
            # ``torch.cuda.stream(...)`` per call (device lookups, availability checks)
            # was the largest Python cost of a batch-1 ``infer`` (serve-run6.log profile)
            self._on_stream = torch.cuda.StreamContext(self._stream)
        mark = self._phase_done("device and stream", mark)
        if check is not None:
            check.wait()
        mark = self._phase_done("load checks", mark)
        kwargs = {} if self._on_cpu else {"device_index": self.device_index,
                                          "run_single_threaded": self.use_cuda_graphs}
        static = [int(n) for n in self.bundle.manifest["engine"]["details"]
                  .get("static_batches", [])]
        names = [DYNAMIC_MODEL, *map(static_model_name, static)]
        try:
            graphs = load_graphs(torch, path, names, **kwargs)
        except BundleError:
            raise
        except Exception as exc:
            raise BundleError(f"torch {torch.__version__} could not load the bundle's "
                              f"AOTInductor package: {exc}") from None
        self._model = graphs[DYNAMIC_MODEL]
        self._static_models = {n: graphs[static_model_name(n)] for n in static}
        mark = self._phase_done("graphs", mark)
        if not self._on_cpu:
            self._in_stream = torch.cuda.Stream(self._device)
            self._out_stream = torch.cuda.Stream(self._device)
            self._on_in_stream = torch.cuda.StreamContext(self._in_stream)
            self._on_out_stream = torch.cuda.StreamContext(self._out_stream)
        self._slots = [self._new_slot() for _ in range(SLOTS)]
        self._name_in = self.input_metadata()[0].name
        self._name_out = self.output_metadata()[0].name
        spec_in, spec_out = self.input_metadata()[0], self.output_metadata()[0]
        self._in_dtype, self._in_row_shape = np.dtype(spec_in.dtype), tuple(spec_in.shape[1:])
        if not self._on_cpu:
            self._stream.synchronize()       # the slots' first event records (_new_slot)
            self._held = cudart_held.find()
            self._row_bytes = tuple(
                math.prod(spec.shape[1:]) * np.dtype(spec.dtype).itemsize
                for spec in (spec_in, spec_out))
        self._phase_done("streams and slots", mark)

    def _torch_dtype(self, spec: TensorSpec):
        return self._torch.from_numpy(np.empty(0, np.dtype(spec.dtype))).dtype

    def _new_slot(self) -> "_Slot":
        torch, n = self._torch, self.max_batch_size
        spec_in, spec_out = self.input_metadata()[0], self.output_metadata()[0]
        in_shape, out_shape = (n, *spec_in.shape[1:]), (n, *spec_out.shape[1:])
        in_dtype, out_dtype = self._torch_dtype(spec_in), self._torch_dtype(spec_out)
        pin = not self._on_cpu
        slot = _Slot()
        slot.host_in = torch.empty(in_shape, dtype=in_dtype, pin_memory=pin)
        slot.host_out = torch.empty(out_shape, dtype=out_dtype, pin_memory=pin)
        slot.host_in_array = slot.host_in.numpy()
        if not self._on_cpu:
            # zeros: a batch padded up to a larger size's graph reads rows past its own
            # (``_graph_batch``); never uninitialized memory there
            slot.device_in = torch.zeros(in_shape, dtype=in_dtype, device=self._device)
            slot.device_out = torch.empty(out_shape, dtype=out_dtype, device=self._device)
            slot.staged = torch.cuda.Event()     # H2D done: host_in may be rewritten
            slot.consumed = torch.cuda.Event()   # device_in copied into the static input
            slot.computed = torch.cuda.Event()   # device_out holds the outputs
            slot.done = self._done_event()       # host_out holds the outputs
            # torch makes an event's CUDA handle at its first record: record each once,
            # so that the held enqueue path has handles to pass
            for event in (slot.staged, slot.consumed, slot.computed, slot.done):
                event.record(self._stream)
        return slot

    def _done_event(self):
        return self._torch.cuda.Event(blocking=self.event_sync == "block")

    def set_event_sync(self, mode: str) -> None:
        """Switch how results are waited for (``event_sync``) on an active runner: each
        slot's pending batch is read out first and its ``done`` event replaced."""
        check_event_sync(mode)
        with self._lock:
            self.event_sync = mode
            if self._on_cpu or not self._slots:
                return
            for slot in self._slots:
                self._resolve(slot)
                slot.done = self._done_event()
                slot.done.record(self._stream)    # its CUDA handle, for the held path
            self._stream.synchronize()

    def pin_host(self, address: int, nbytes: int):
        """On a GPU, with the held enqueue path's runtime found: page-locked in place
        (``infer_rows_async`` then copies rows from there to the device, no staging)."""
        if self._held is None or self._on_cpu:
            return None
        return pinned_host.pin(address, nbytes, self._held)

    def allocate_host(self, shape: tuple[int, ...], dtype: np.dtype) -> np.ndarray:
        """Pinned memory on a GPU (remembered, so that ``infer`` reads it in place)."""
        if self._torch is None or self._on_cpu:
            return np.empty(shape, dtype)
        tensor = self._torch.empty(shape, dtype=self._torch.from_numpy(np.empty(0, dtype)).dtype,
                                   pin_memory=True)
        arr = tensor.numpy()
        self._pinned.add(arr)            # the array keeps the tensor alive, not vice versa
        return arr

    def deactivate_impl(self) -> None:
        for stream in (self._in_stream, self._stream, self._out_stream):
            if stream is not None:
                stream.synchronize()
        self._reset()

    # -- inference --------------------------------------------------------------------
    def infer_impl(self, feeds: dict[str, np.ndarray], n: int) -> dict[str, np.ndarray]:
        """One batch, start to end, on the compute stream alone (a caller that waits gains
        nothing from the copy streams, and on the H200 the three-stream path cost 0.2 ms at
        batch 1 and up to 1.7 ms at batch 32 more than this)."""
        if self._on_cpu:
            return self.infer_async_impl(feeds, n).result()
        arr = feeds[self._name_in]
        with self._lock:
            slot = self._take_slot()
            out, out_array = slot.outputs(n)
            pinned = self._in_pinned(arr)
            if self._held_applies(n) and (pinned or self._stages_pinned(arr)):
                self._infer_held(slot, arr, n, pinned)
            else:
                m = self._graph_batch(n)
                with self._on_stream:
                    x, _ = self._static_buffers(m)
                    self._stage(slot, arr, n, x)
                    out.copy_(self._run(m, x, None)[:n], non_blocking=True)
            # no event to record: the stream is drained before the slot is used again
            self._stream.synchronize()
            return {self._name_out: copy_held(out_array)}

    def _stages_pinned(self, arr: np.ndarray) -> bool:
        """Whether ``infer`` stages plain ``arr`` in pinned memory (``staging``)."""
        return self.staging == "pinned" or (self.staging == "auto"
                                            and arr.nbytes < PARALLEL_MIN_BYTES)

    def _infer_held(self, slot: "_Slot", arr: np.ndarray, n: int, pinned: bool) -> None:
        """``infer_impl``'s batch on the compute stream through ``cudart_held``: the input
        straight into the graph's static input (from ``arr`` where it lies in pinned
        memory, ``pinned``; else from the slot's staging rows, ``copy_rows`` over threads
        with each chunk's H2D copy enqueued as soon as it is copied, so the copy of the
        first rows to the device overlaps the host copy of the last), the graph, the
        output to the slot's pinned output. Not synchronized. Only where
        ``_held_applies(n)``. (The graph is the size's, or a larger one's whose rows past
        ``n`` are padding: ``_graph_batch``.)"""
        held = self._held
        _, graph, graph_exec, (x, y) = self._captured(n)
        row_in = self._row_bytes[0]
        stream, x_at = self._stream.cuda_stream, x.data_ptr()
        previous = held.on_device(self.device_index)
        try:
            if pinned:
                held.memcpy(x_at, arr.__array_interface__["data"][0], n * row_in,
                            cudart_held.HOST_TO_DEVICE, stream)
            else:
                staging = slot.host_in_array[:n]
                base = staging.__array_interface__["data"][0]

                def send(first: int, rows: int) -> None:
                    held.memcpy(x_at + first * row_in, base + first * row_in, rows * row_in,
                                cudart_held.HOST_TO_DEVICE, stream)
                copy_rows(staging, arr, on_chunk=send)
            if graph_exec is not None:
                held.launch(graph_exec, stream)
            else:                                              # (one GIL release)
                with self._on_stream:
                    graph.replay()
            held.memcpy(slot.host_out.data_ptr(), y.data_ptr(), n * self._row_bytes[1],
                        cudart_held.DEVICE_TO_HOST, stream)
        finally:
            if previous != self.device_index:
                held.on_device(previous)

    @staticmethod
    def _resolve(slot: "_Slot") -> None:
        """Read out the slot's previous batch (into its Pending) before the slot is reused."""
        read_out(slot.pending)
        slot.pending = None

    @property
    def static_batches(self) -> list[int]:
        """The batch sizes that run on a graph of their own (empty before ``activate``)."""
        return sorted(self._static_models)

    def _run_model(self, x):
        with self._torch.no_grad():     # (a graph replay needs no autograd switch)
            out = self._static_models.get(int(x.shape[0]), self._model)(x)
        return out[0] if isinstance(out, (list, tuple)) else out

    def infer_async_impl(self, feeds: dict[str, np.ndarray], n: int) -> Pending:
        with self._lock:
            slot = self._take_slot()
            if self._on_cpu:
                out = self._run_model(self._host_source(slot, feeds[self._name_in], n))
                return Pending.done({self._name_out: out.numpy().copy()})
            arr = feeds[self._name_in]
            if not (self._held_applies(n) and self._in_pinned(arr)):
                self._enqueue_torch(slot, arr, n)
            else:
                self._enqueue_held(slot, [(arr.__array_interface__["data"][0],
                                          n * self._row_bytes[0])], n)
            return self._pending(slot, n)

    @property
    def stages_rows(self) -> bool:
        """Whether ``stage_rows`` can take rows (active on a GPU, enqueueing through
        ``cudart_held``)."""
        return (self.is_active and not self._on_cpu and self._held is not None
                and self.enqueue == "held")

    def _input_rows(self, parts: dict[str, list[np.ndarray]]) -> int | None:
        """The rows in ``parts`` where they are all rows of the one input, else None."""
        if list(parts) != [self._name_in]:
            return None
        n = 0
        for part in parts[self._name_in]:
            if part.dtype != self._in_dtype or part.shape[1:] != self._in_row_shape:
                return None
            n += part.shape[0]
        return n

    def stage_rows(self, parts: dict[str, list[np.ndarray]], first_row: int,
                   staged_by: object) -> bool:
        """Enqueue the H2D copies of rows of the next batch (the next slot's device input,
        from row ``first_row``) before that batch is dispatched, on the copy-in stream
        after the slot's last batch consumed its input; pieces outside pinned memory are
        written into the slot's staging rows first. Rows may be staged again from any row
        up to those staged (the stream copies in order: the later copy wins); a gap, rows
        beyond the max batch or pieces that are not input rows are declined (False).
        ``infer_rows_async(..., staged_rows, staged_by)`` then copies only the rest."""
        n = self._input_rows(parts)
        if n is None or not self.stages_rows:
            return False
        with self._lock:
            slot = self._slots[self._next_slot]
            held_rows = slot.staged_rows if slot.staged_by is staged_by else 0
            if not may_stage(first_row, n, held_rows, self.max_batch_size):
                return False
            self._resolve(slot)         # its staging rows may be rewritten
            held = self._held
            previous = held.on_device(self.device_index)
            try:
                self._copy_in(slot, self._row_sources(slot, parts[self._name_in], first_row),
                              first_row)
            finally:
                if previous != self.device_index:
                    held.on_device(previous)
            slot.staged_rows, slot.staged_by = first_row + n, staged_by
            return True

    def _copy_in(self, slot: "_Slot", sources: list[tuple[int, int]], first_row: int) -> None:
        """Enqueue, on the copy-in stream through ``cudart_held``, the H2D copies of
        ``sources`` ((host address, bytes) in pinned memory, in row order) into the slot's
        device input from row ``first_row``, after its last batch consumed that input
        (the calling thread on the runner's device)."""
        held, s_in = self._held, self._in_stream.cuda_stream
        held.wait(s_in, slot.consumed.cuda_event)          # device_in free again
        at = slot.device_in.data_ptr() + first_row * self._row_bytes[0]
        for address, size in sources:
            held.memcpy(at, address, size, cudart_held.HOST_TO_DEVICE, s_in)
            at += size

    def infer_rows_async(self, parts: dict[str, list[np.ndarray]], staged_rows: int = 0,
                         staged_by: object = None) -> Pending | None:
        """A batch given as its requests' rows, copied to the device where they lie: one
        H2D copy per piece in pinned memory (``input_buffers``, or page-locked in place:
        ``runtime_py.pinned_host``, e.g. the front-end workers' arenas), the others first
        written into the slot's pinned staging rows (with the GIL held). No host gather of
        the whole batch. None (nothing started) where the held enqueue path does not apply
        (see ``_held_applies``) or the pieces are not rows of the input: the caller then
        gathers them and calls ``infer_async``."""
        if not self.is_active or self._on_cpu:
            return None
        n = self._input_rows(parts)
        if n is None or not 1 <= n <= self.max_batch_size or not self._held_applies(n):
            return None
        rows = parts[self._name_in]
        with self._lock:
            slot = self._take_slot()
            skip = rows_to_skip(staged_rows, staged_by, *slot.staged_ahead, n)
            if skip:
                rows = _rows_after(rows, skip)
                self.staged_rows_used += skip
            self._enqueue_held(slot, self._row_sources(slot, rows, skip), n, skip)
            return self._pending(slot, n)

    def _take_slot(self) -> "_Slot":
        """The next batch slot, its previous batch read out (call with the lock held)."""
        slot = self._slots[self._next_slot]
        self._next_slot = (self._next_slot + 1) % len(self._slots)
        self._resolve(slot)
        slot.staged_ahead = (slot.staged_rows, slot.staged_by)
        slot.staged_rows, slot.staged_by = 0, None
        return slot

    def _pending(self, slot: "_Slot", n: int) -> Pending:
        done, host_out, name_out = slot.done, slot.outputs(n)[1], self._name_out

        def wait() -> dict[str, np.ndarray]:
            done.synchronize()
            return {name_out: copy_held(host_out)}

        slot.pending = Pending(wait)
        return slot.pending

    def _held_applies(self, n: int) -> bool:
        """Whether a batch of ``n`` can be enqueued through ``cudart_held``: chosen, the
        runtime library found, and the size's CUDA graph captured (the torch path captures
        it on the size's first batch)."""
        return (self._held is not None and self.enqueue == "held"
                and self._graph_batch(n) in self._graphs)

    def _graph_batch(self, n: int) -> int:
        """The batch size whose graph runs a batch of ``n`` (``cuda_graph_sizes``)."""
        if not self.use_cuda_graphs:
            return n
        return graph_batch(self.cuda_graph_sizes, n)

    def _captured(self, n: int) -> tuple[int, Any, int | None, tuple[Any, Any]]:
        """For a batch of ``n`` on the held path (``_held_applies(n)``): the size ``m``
        whose graph runs it, that graph, its raw exec handle, and its static (input,
        output) buffers of ``m`` rows."""
        m = self._graph_batch(n)
        graph = self._graphs[m]
        return m, graph, self._graph_exec(m, graph), self._static[m]

    def _in_pinned(self, arr: np.ndarray) -> bool:
        return arr.flags.c_contiguous and (pinned_host.holds(arr)
                                           or self._pinned.owner_of(arr) is not None)

    def _row_sources(self, slot: "_Slot", parts: list[np.ndarray],
                     first_row: int = 0) -> list[tuple[int, int]]:
        """(host address, bytes) of each H2D copy that fills the batch in order from row
        ``first_row``: a piece in pinned memory as it is, any other written into the
        slot's staging rows at its place; pieces adjacent in memory make one copy."""
        sources: list[tuple[int, int]] = []
        staging, row = slot.host_in_array, first_row
        for part in parts:
            rows = part.shape[0]
            if not rows:
                continue
            # the address read once (``_in_pinned`` would read it again: ~2 us a piece, on
            # the dispatch path of every batch)
            address, size = part.__array_interface__["data"][0], part.nbytes
            if not (part.flags.c_contiguous and (pinned_host.holds_span(address, address + size)
                                                 or self._pinned.owner_of(part) is not None)):
                part = gather_rows(staging[row:row + rows], [part])
                address = part.__array_interface__["data"][0]
            if sources and sum(sources[-1]) == address:
                sources[-1] = (sources[-1][0], sources[-1][1] + size)
            else:
                sources.append((address, size))
            row += rows
        return sources

    def _enqueue_held(self, slot: "_Slot", sources: list[tuple[int, int]], n: int,
                      first_row: int = 0) -> None:
        """The batch's copies, events and graph launch through ``cudart_held`` (no GIL
        release), its input copied from ``sources`` ((host address, bytes) in pinned
        memory, in row order) from row ``first_row`` on (the rows before it were staged:
        ``stage_rows``). Only where ``_held_applies(n)``. The graph may be a larger size's
        (``_graph_batch``): it reads the slot's rows past ``n`` too, as padding."""
        held = self._held
        m, graph, graph_exec, (x, y) = self._captured(n)
        in_bytes, out_bytes = m * self._row_bytes[0], n * self._row_bytes[1]
        s_in, s_compute, s_out = (self._in_stream.cuda_stream, self._stream.cuda_stream,
                                  self._out_stream.cuda_stream)
        device_in, device_out = slot.device_in.data_ptr(), slot.device_out.data_ptr()
        previous = held.on_device(self.device_index)
        try:
            self._copy_in(slot, sources, first_row)
            held.record(slot.staged.cuda_event, s_in)
            held.wait(s_compute, slot.staged.cuda_event)
            held.memcpy(x.data_ptr(), device_in, in_bytes, cudart_held.DEVICE_TO_DEVICE,
                        s_compute)
            held.record(slot.consumed.cuda_event, s_compute)
            if graph_exec is not None:
                held.launch(graph_exec, s_compute)
            else:                                              # (one GIL release)
                with self._on_stream:
                    graph.replay()
            held.memcpy(device_out, y.data_ptr(), out_bytes, cudart_held.DEVICE_TO_DEVICE,
                        s_compute)
            held.record(slot.computed.cuda_event, s_compute)
            held.wait(s_out, slot.computed.cuda_event)
            held.memcpy(slot.host_out.data_ptr(), device_out, out_bytes,
                        cudart_held.DEVICE_TO_HOST, s_out)
            held.record(slot.done.cuda_event, s_out)
        finally:
            if previous != self.device_index:
                held.on_device(previous)

    def _graph_exec(self, n: int, graph) -> int | None:
        """The captured graph's cudaGraphExec_t (None where this torch cannot say: the
        held path then replays it through torch)."""
        if n not in self._graph_execs:
            try:
                self._graph_execs[n] = int(graph.raw_cuda_graph_exec()) or None
            except (AttributeError, RuntimeError):
                self._graph_execs[n] = None
        return self._graph_execs[n]

    def _enqueue_torch(self, slot: "_Slot", arr: np.ndarray, n: int) -> None:
        """The batch's copies, events and engine through torch's stream calls (and the
        capture of the size's CUDA graph on its first batch)."""
        with self._on_in_stream:
            self._in_stream.wait_event(slot.consumed)      # device_in free again
            self._stage(slot, arr, n, slot.device_in)
            slot.staged.record(self._in_stream)
        m = self._graph_batch(n)                 # (rows past n: padding)
        with self._on_stream:
            self._stream.wait_event(slot.staged)
            x, _ = self._static_buffers(m)
            x.copy_(slot.device_in[:m])
            slot.consumed.record(self._stream)
            slot.device_out[:n].copy_(self._run(m, x, None)[:n])
            slot.computed.record(self._stream)
        with self._on_out_stream:
            self._out_stream.wait_event(slot.computed)
            slot.host_out[:n].copy_(slot.device_out[:n], non_blocking=True)
            slot.done.record(self._out_stream)

    def _host_source(self, slot: "_Slot", arr: np.ndarray, n: int):
        """The batch as a host tensor: the slot's staging buffer (pinned on a GPU) after one
        threaded copy, so the caller's array is never an engine buffer."""
        staging = slot.host_in[:n]
        copy_rows(staging.numpy(), arr)
        return staging

    def _pinned_source(self, arr: np.ndarray):
        """``arr`` as a tensor the device copy reads in place when it lies in pinned
        memory (``_in_pinned``: ``input_buffers``, or page-locked in place), else None.
        (torch wraps only writable arrays without a warning.)"""
        if arr.flags.writeable and self._in_pinned(arr):
            return self._torch.from_numpy(arr)
        return None

    def _stage(self, slot: "_Slot", arr: np.ndarray, n: int, device) -> None:
        """Enqueue, on the current stream, the copy of host batch ``arr`` into
        ``device[:n]``: straight from the caller's pinned array (no host copy), else per
        ``staging``: through the slot's pinned staging buffer (one threaded host copy,
        then an async H2D), or the driver's pageable copy."""
        dst = device if device.shape[0] == n else device[:n]
        source = self._pinned_source(arr)
        if source is not None:
            dst.copy_(source, non_blocking=True)
            return
        if self.staging != "pinned" and arr.flags.c_contiguous and arr.flags.writeable:
            dst.copy_(self._torch.from_numpy(arr))    # (torch cannot wrap other layouts)
            return
        slot.staged.synchronize()          # the previous H2D from host_in has finished
        staging = slot.host_in[:n]

        def send(first: int, rows: int) -> None:   # each chunk's H2D as soon as it is copied
            dst[first:first + rows].copy_(staging[first:first + rows], non_blocking=True)
        copy_rows(staging.numpy(), arr, on_chunk=send)

    def run_device(self, n: int):
        """Run the engine on its own device input buffer of batch ``n`` (for benchmarks:
        engine time without host copies), on the graph serving would use for ``n``
        (``_graph_batch``); returns the device output's ``n`` rows. Not synchronized."""
        m = self._graph_batch(n)
        with self._lock, self._on_stream:
            x, y = self._static_buffers(m)
            return self._run(m, x, y)[:n]

    def device_timings(self, batch_size: int, iterations: int = 200, warmup: int = 20
                       ) -> dict[str, list[float]]:
        """Per-iteration seconds under ``runtime_py.bench.DEVICE_TIMING_BOUNDARIES``: the
        engine alone on the batch already in its device buffer (a CUDA graph replay where
        captured), then with the pinned host copies around it; the runner's stream is
        synchronized every iteration. Inputs uniform in [-1, 1], as `bundle study` feeds
        ``infer``. A batch runs on the graph serving would use for it (``_graph_batch``:
        with ``cuda_graph_sizes``, a larger size's, its ``n`` rows copied in and out). A
        CPU package has no device side: {} (the caller times ``infer``)."""
        from runtime_py.bench import random_feeds, time_boundaries

        if self._on_cpu:
            return {}
        spec = self.input_metadata()[0]
        feeds = random_feeds([spec], int(batch_size))
        n = self.checked_batch(feeds)
        stream, on_stream = self._stream, self._on_stream
        with self._lock:
            for slot in self._slots:       # nothing of infer_async may still be in flight
                self._resolve(slot)
            host_in, host_out = self._slots[0].host_in[:n], self._slots[0].host_out[:n]
            host_in.numpy()[...] = feeds[spec.name]
            m = self._graph_batch(n)
            x, _ = self._static_buffers(m)
            x[:n].copy_(host_in)

            def engine_only() -> None:
                with on_stream:
                    self._run(m, x, None)
                stream.synchronize()

            def with_copies() -> None:
                with on_stream:
                    x[:n].copy_(host_in, non_blocking=True)
                    host_out.copy_(self._run(m, x, None)[:n], non_blocking=True)
                stream.synchronize()

            return time_boundaries({"graph_replay": engine_only, "with_copies": with_copies},
                                   iterations, warmup)

    @property
    def stream(self):
        return self._stream

    def _static_buffers(self, n: int):
        if n not in self._static:
            spec_in = self.input_metadata()[0]
            x = self._torch.zeros((n, *spec_in.shape[1:]), dtype=self._torch_dtype(spec_in),
                                  device=self._device)
            self._static[n] = (x, None)
        return self._static[n]

    def _run(self, n: int, x, y):
        if not self.use_cuda_graphs or n in self.graph_failures:
            return self._run_model(x)
        graph = self._graphs.get(n)
        if graph is None:
            graph = self._capture(n, x)
            if graph is None:
                return self._run_model(x)
        graph.replay()
        return self._static[n][1]

    def prepare(self, batch_sizes, progress=None) -> None:
        """Capture the CUDA graph of each size in ``batch_sizes`` now (sizes outside
        1..max_batch_size, already captured or failed before are skipped): a size's first
        batch otherwise runs a warm-up and a capture while its clients and the batch
        behind it wait: tens of ms, or seconds where the package calls cuDNN (its
        convolutions are planned per shape; ``capture_seconds``). The graphs share one
        memory pool (``_capture``). ``progress(done, total)`` after each size captured,
        with the runner's lock held: it must not call back into the runner."""
        if not self.use_cuda_graphs or self._on_cpu or not self.is_active:
            return
        with self._lock:
            for slot in self._slots:            # nothing of infer_async may be in flight
                self._resolve(slot)
            todo = sorted({m for m in (self._graph_batch(int(n)) for n in batch_sizes
                                       if 1 <= int(n) <= self.max_batch_size)
                           if m not in self._graphs and m not in self.graph_failures})
            for done, n in enumerate(todo, 1):
                with self._on_stream:
                    self._capture(n, self._static_buffers(n)[0])
                if progress is not None:
                    progress(done, len(todo))
            self._stream.synchronize()

    @property
    def cudnn_benchmark(self) -> bool:
        """Whether any graph's warm-up times cuDNN's algorithms."""
        return self._cudnn_sizes != frozenset()

    def cudnn_timing(self) -> bool | list[int]:
        """Which graphs' warm-ups time cuDNN's algorithms, in the manifest's form: True
        (every size), False, or the batch sizes ascending."""
        return cudnn_record(self._cudnn_sizes)

    def times_cudnn(self, n: int) -> bool:
        """Whether the warm-up of the graph of batch size ``n`` times cuDNN's algorithms."""
        return self._cudnn_sizes is None or n in self._cudnn_sizes

    def _capture(self, n: int, x):
        """Capture batch size ``n`` on the runner's stream; None (and the reason recorded)
        when capture fails.

        Every size's graph is captured into one memory pool: graphs run one at a time, on
        the compute stream, and each graph's output stays allocated (``_static``), so a
        later capture never takes its memory; only the intermediates are shared (a pool
        per size would hold every size's activations at once).
        ``capture_error_mode="thread_local"``: another thread of the process may make
        CUDA calls meanwhile (the engine process page-locks a client's shared-memory
        region as it registers); in the default global mode one such call failed the
        capture of a size first seen under load, and that batch's requests (H200,
        docs/measurements/h200-2026-12-02-d, call 2)."""
        torch = self._torch
        try:
            t0 = time.perf_counter()
            with timed_cudnn_algorithms(torch, self.times_cudnn(n)):
                self._run_model(x)                    # warm-up: allocations, kernel loads
                self._stream.synchronize()
            t1 = time.perf_counter()
            graph = torch.cuda.CUDAGraph()
            if self._graph_pool is None:
                self._graph_pool = torch.cuda.graph_pool_handle()
            with torch.cuda.graph(graph, pool=self._graph_pool, stream=self._stream,
                                  capture_error_mode="thread_local"):
                y = self._run_model(x)
            self.capture_seconds[n] = (t1 - t0, time.perf_counter() - t1)
        except Exception as exc:  # capture is an optimization: fall back, say why
            self.graph_failures[n] = f"{type(exc).__name__}: {exc}"
            torch.cuda.synchronize(self._device)
            return None
        self._static[n] = (x, y)
        self._graphs[n] = graph
        return graph
