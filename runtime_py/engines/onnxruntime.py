"""ONNX Runtime runner: the embedded default engine, over the bundle's `model.onnx`.

Runs every bundle (fp32, fp16 and fp8 Q/DQ graphs all run on the CPU provider), since
`model.onnx` is always present. The CUDA provider is used when onnxruntime-gpu is
installed and `providers` does not say otherwise.
"""

from __future__ import annotations

import os

import numpy as np

from runtime_py.engines.base import Runner
from runtime_py.engines.onnxruntime_compat import require_onnxruntime, upgrade_hint
from runtime_py.errors import CompatibilityError, EngineUnavailableError, UsageError

#: Intra-op threads of every ONNX Runtime session trt-bundle opens where the caller gives
#: none (a runner's ``intra_op_threads`` option wins). ONNX Runtime reads no variable of
#: its own: unset, each session starts a thread per core, so N processes on one host (serve
#: replicas, build jobs, test workers) run N x cores spinning threads.
THREADS_ENV = "TRT_BUNDLE_ORT_THREADS"


def import_onnxruntime():
    try:
        import onnxruntime
    except ImportError:
        raise EngineUnavailableError(
            "the onnxruntime engine needs the onnxruntime package: "
            "pip install 'trt-bundle[ort]'") from None
    return onnxruntime


#: ONNX Runtime 1.30 refuses timm_vit_base's fp8 graph (FP8 Q/DQ on MatMul) at every
#: optimization level but BASIC, 1.31 at ENABLE_ALL; 1.32 runs every family's graphs
#: (pyproject.toml's lower bound).
MIN_VERSION = "1.32"
UPGRADE_HINT = upgrade_hint(MIN_VERSION)


def require_build_version(version: str | None = None) -> None:
    """Refuse an ONNX Runtime older than ``MIN_VERSION`` before `bundle make` does any work.

    Every make runs ONNX Runtime (calibration, reference outputs), and an older one fails
    only where it first loads a graph it cannot type: timm_vit_base's fp8 graph on 1.30,
    after the export, the calibration and, on a GPU, minutes of engine build beside it
    (forty-sixth session: a device call's ViT builds lost that way, the image's own 1.30).
    Serving stays lenient: a runner refuses only a graph its ONNX Runtime cannot load.
    ``version``: the installed one where None."""
    if version is None:
        version = import_onnxruntime().__version__
    require_onnxruntime(version, MIN_VERSION, "trt-bundle")


def optimization_level(ort, precision: str):
    """ENABLE_ALL, except for FP8 Q/DQ graphs, which run as written.

    ONNX Runtime's graph optimizer rewrites FP8 Q/DQ graphs in ways that change their
    arithmetic: on timm_xception's fp8-depthwise graph (1.32, CPU) every level from BASIC
    up gave logits 0.075 off fp32 where the unoptimized graph gives 0.0033. Unoptimized
    costs about 6% on the fp8 graph, and the outputs are those of the graph the bundle
    ships (and of its reference member).
    """
    levels = ort.GraphOptimizationLevel
    return levels.ORT_DISABLE_ALL if precision == "fp8" else levels.ORT_ENABLE_ALL


def reproducible_level(ort, precision: str):
    """The level of the sessions whose results go into a bundle's bytes (calibration
    ranges, reference outputs, quality figures): ENABLE_EXTENDED where the runner uses
    ENABLE_ALL; FP8 graphs as the runner runs them (DISABLE_ALL).

    ENABLE_ALL adds the NCHWc layout, whose convolution kernels block the channels by the
    CPU's vector width (8 floats with AVX2, 16 with AVX-512) and so sum in another order:
    the same graph and inputs give other last bits on another CPU, hence other references
    and another bundle id (timm_xception's fp8 smoke bundle, same lock: 957033e2... on the
    machines of earlier sessions, 44ebab92... on an AVX-512 one). Without it convolutions
    run as im2col + SGEMM, which sums each output in the same order with AVX2 and AVX-512
    (``bundler.graphs.portable`` has what was measured, and what else it rewrites). The
    runtime keeps ENABLE_ALL (faster); its outputs differ from the references by rounding,
    which ``bundle verify --numerics`` allows for.
    """
    levels = ort.GraphOptimizationLevel
    return levels.ORT_DISABLE_ALL if precision == "fp8" else levels.ORT_ENABLE_EXTENDED


def threads_from_environment() -> int | None:
    """``$TRT_BUNDLE_ORT_THREADS`` as a thread count (None where unset, empty or 0: ONNX
    Runtime's own default)."""
    raw = os.environ.get(THREADS_ENV, "").strip()
    if not raw:
        return None
    try:
        threads = int(raw)
    except ValueError:
        threads = -1
    if threads < 0:
        raise UsageError(f"${THREADS_ENV} is {raw!r}: give a whole number of threads (1 per "
                         f"process where several share the cores, 0 for one per core) or unset it")
    return threads or None


def session_options(ort, precision: str | None = None, intra_op_threads: int | None = None,
                    inter_op_threads: int | None = None, *, reproducible: bool = False):
    """The SessionOptions of every session trt-bundle opens: the runner's optimization level
    for ``precision`` (ONNX Runtime's default where None), or with ``reproducible`` the
    level whose results do not depend on the CPU (``reproducible_level``; fp32 where
    ``precision`` is None); threads as given, else from ``$TRT_BUNDLE_ORT_THREADS``."""
    opts = ort.SessionOptions()
    if reproducible:
        opts.graph_optimization_level = reproducible_level(ort, precision or "fp32")
    elif precision is not None:
        opts.graph_optimization_level = optimization_level(ort, precision)
    intra = intra_op_threads or threads_from_environment()
    if intra:
        opts.intra_op_num_threads = int(intra)
    if inter_op_threads:
        opts.inter_op_num_threads = int(inter_op_threads)
    return opts


def cpu_session(model_bytes: bytes, precision: str = "fp32"):
    """A quiet CPU session over a graph for the bundler's reference outputs and evaluation:
    the runner's arithmetic, at the level whose results are the same with AVX2 and AVX-512
    (``reproducible_level``), so that a bundle's bytes do not depend on the machine that
    made it."""
    ort = import_onnxruntime()
    opts = session_options(ort, precision, reproducible=True)
    opts.log_severity_level = 3
    try:
        return ort.InferenceSession(model_bytes, opts, providers=["CPUExecutionProvider"])
    except Exception as exc:  # ORT raises its own exception types for graphs it cannot load
        raise CompatibilityError(f"onnxruntime {ort.__version__} cannot load the {precision} "
                                 f"graph: {exc}. {UPGRADE_HINT}") from None


def default_providers(ort, device: int = 0) -> list:
    available = ort.get_available_providers()
    if "CUDAExecutionProvider" in available:
        return [("CUDAExecutionProvider", {"device_id": device}), "CPUExecutionProvider"]
    return ["CPUExecutionProvider"]


class OnnxRuntimeRunner(Runner):
    """Options: providers (list), device (int), intra_op_threads, inter_op_threads (int)."""

    backend = "onnxruntime"

    def activate_impl(self) -> None:
        ort = import_onnxruntime()
        opts = session_options(ort, self.bundle.manifest.get("precision", ""),
                               self.options.get("intra_op_threads"),
                               self.options.get("inter_op_threads"))
        providers = self.options.get("providers") or default_providers(
            ort, int(self.options.get("device") or 0))
        try:
            self.session = ort.InferenceSession(self.bundle.read_member("model.onnx"),
                                                sess_options=opts, providers=providers)
        except Exception as exc:  # ORT raises its own exception types for bad graphs
            raise CompatibilityError(
                f"onnxruntime {ort.__version__} cannot load {self.bundle.path.name}'s "
                f"model.onnx: {exc}. {UPGRADE_HINT}") from None
        self.output_names = [o.name for o in self.session.get_outputs()]
        self.providers = self.session.get_providers()

    @property
    def on_gpu(self) -> bool:
        return self.is_active and self.providers[0] != "CPUExecutionProvider"

    def deactivate_impl(self) -> None:
        self.session = None

    def infer_impl(self, feeds: dict[str, np.ndarray], n: int) -> dict[str, np.ndarray]:
        outputs = self.session.run(self.output_names, feeds)
        return dict(zip(self.output_names, outputs))
