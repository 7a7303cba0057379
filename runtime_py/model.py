"""`load()`: a verified bundle with an engine session, preprocessing and labels.

This is the object services hold. `infer` takes preprocessed batches of any size (larger
than the engine's max batch is split and the outputs concatenated); `classify` takes
images and returns top-k labels through the bundle's own preprocessing.
"""

from __future__ import annotations

import logging
import os
from typing import Callable, Iterable, Sequence

import numpy as np

from runtime_py.engines import runner_class
from runtime_py.pending import Pending
from runtime_py.errors import CompatibilityError, InferenceInputError, UsageError
from runtime_py.format import Bundle, open_bundle
from runtime_py.signing import check_trust
from runtime_py.targets import TARGETS
from runtime_py.tensors import FeedChecker, TensorSpec

log = logging.getLogger(__name__)

#: backend -> serving platform name (KServe/Triton), from the registry (``runtime_py.targets``)
PLATFORMS = {t.name: t.platform for t in TARGETS}


def softmax(logits: np.ndarray) -> np.ndarray:
    x = logits.astype(np.float64, copy=False)
    x = x - x.max(axis=-1, keepdims=True)
    e = np.exp(x)
    return e / e.sum(axis=-1, keepdims=True)


def served_name(manifest: dict) -> str:
    """The bundle name without its engine-target part: one name for the same model whichever
    engine serves it (`timm_xception-fp8-1.0.0-tensorrt-sm90-trt11.4` -> `timm_xception-fp8-1.0.0`)."""
    name, backend = manifest["name"], manifest["engine"]["backend"]
    cut = name.rfind("-" + backend)
    return name[:cut] if cut > 0 else name


class Model:
    """A loaded bundle. Thread-safety: `infer` is as thread-safe as the engine session
    (ONNX Runtime's is); serve concurrent clients through `runtime_py.batcher.Batcher`."""

    def __init__(self, bundle: Bundle, runner, fallback_reason: str | None = None) -> None:
        self.bundle = bundle
        self.runner = runner
        self.fallback_reason = fallback_reason
        m = bundle.manifest
        self.id = bundle.id
        self.name = served_name(m)
        self.version = bundle.id[:12]
        self.backend = runner.backend
        self.platform = PLATFORMS.get(runner.backend, runner.backend)
        self.inputs: list[TensorSpec] = runner.input_metadata()
        self.outputs: list[TensorSpec] = runner.output_metadata()
        self.max_batch_size = runner.max_batch_size
        self._check_feeds = FeedChecker(self.inputs)     # valid feeds: a fast comparison
        self.labels = bundle.labels
        self._preprocessor = None

    # -- inference -----------------------------------------------------------------------
    def _as_feeds(self, inputs) -> dict[str, np.ndarray]:
        if isinstance(inputs, np.ndarray):
            if len(self.inputs) != 1:
                raise InferenceInputError(
                    f"this model takes {len(self.inputs)} inputs; pass a dict by name")
            return {self.inputs[0].name: inputs}
        return inputs

    def infer(self, inputs) -> dict[str, np.ndarray]:
        """Run a batch (array for single-input models, or dict name -> array) of any size;
        the outputs are the caller's own arrays.

        A batch larger than the engine's max batch is cut into engine batches that run
        pipelined (the copy of one overlaps the compute of the other on GPU engines).
        Feeds written into ``input_buffers()`` are read in place (no host copy)."""
        feeds = self._as_feeds(inputs)
        batch = self._check_feeds(feeds)
        limit = self.max_batch_size
        if batch <= limit:
            return self.runner.infer_checked(feeds, batch)
        pending = [self.runner.infer_async({k: v[i:i + limit] for k, v in feeds.items()})
                   for i in range(0, batch, limit)]
        parts = [p.result() for p in pending]
        return {name: np.concatenate([p[name] for p in parts]) for name in parts[0]}

    def infer_async(self, inputs) -> Pending:
        """Start one batch of at most ``max_batch_size`` rows; ``result()`` waits for it.

        Keep the input arrays unchanged until then. On GPU engines this returns once the
        copies and the engine are enqueued, so a caller can prepare the next batch while
        this one runs (``runtime_py.batcher.Batcher`` does)."""
        return self.runner.infer_async(self._as_feeds(inputs))

    def infer_rows_async(self, parts: dict[str, list[np.ndarray]], staged_rows: int = 0,
                         staged_by: object = None) -> Pending | None:
        """Start one batch given as each input's rows in pieces (in order; at most
        ``max_batch_size`` rows, already checked against the inputs, as
        ``runtime_py.batcher.Batcher`` checks its requests), copied to the device where
        they lie by engines that can (torch-aoti on a GPU: no host gather of the batch);
        None, with nothing started, where the engine cannot: gather them and call
        ``infer_async``. ``staged_rows`` / ``staged_by``: see ``stage_rows``."""
        return self.runner.infer_rows_async(parts, staged_rows, staged_by)

    @property
    def staged_rows_used(self) -> int:
        """Rows that dispatches found staged (``stage_rows``) and did not copy again."""
        return self.runner.staged_rows_used

    @property
    def stages_rows(self) -> bool:
        """Whether ``stage_rows`` takes rows on this engine (torch-aoti on a GPU)."""
        return self.runner.stages_rows

    def stage_rows(self, parts: dict[str, list[np.ndarray]], first_row: int,
                   staged_by: object) -> bool:
        """Start copying rows of the next batch to the device while that batch is still
        being collected (as its rows ``first_row..``; False, nothing started, where the
        engine cannot), so that its dispatch (``infer_rows_async(parts, staged_rows,
        staged_by)``) copies only the rows that came last: a batcher's rows arrive over a
        client round trip, and copied at dispatch the engine waits for all of them."""
        return self.runner.stage_rows(parts, first_row, staged_by)

    def prepare(self, batch_sizes: Iterable[int],
                progress: Callable[[int, int], None] | None = None) -> None:
        """Do now what the first batch of each size would otherwise do (a GPU engine
        captures its CUDA graph for each size): a service calls this before it takes
        requests (``Batcher`` does), so that no client waits for it. A no-op where the
        engine has nothing to prepare. It can take a while (the torch-aoti fp16 bundle of
        timm_xception: ~73 s for sizes 1..32 on an H100, its cuDNN convolutions' first run
        at each size; docs/measurements/h100-2026-12-05-d): ``progress(done, total)`` is
        called after each size the engine prepared, for a caller that shows it."""
        if progress is None:     # (a runner of the caller's own may not take it)
            self.runner.prepare(batch_sizes)
        else:
            self.runner.prepare(batch_sizes, progress=progress)

    def pin_host(self, address: int, nbytes: int):
        """Page-lock ``nbytes`` of host memory at ``address`` in place, for an engine that
        copies from page-locked memory without staging (``runtime_py.pinned_host``): the
        ``PinnedRange`` to ``unpin()`` before that memory is unmapped, or None where the
        engine has no use for it (CPU engines) or the CUDA runtime refused."""
        return self.runner.pin_host(address, nbytes)

    def input_buffers(self) -> dict[str, np.ndarray]:
        """Host arrays of the max batch, one per input, to write batches into: on GPU
        engines they are pinned memory that ``infer``/``infer_async`` read in place (zero
        host copies: write rows into ``buffers[name][:n]`` and pass that slice). Each call
        allocates new buffers; keep and reuse them, one set per batch in flight."""
        return self.runner.input_buffers()

    # -- images --------------------------------------------------------------------------
    @property
    def preprocessor(self):
        if self._preprocessor is None:
            from runtime_py.preprocess import Preprocessor

            spec = self.bundle.preprocess
            if spec is None:
                raise UsageError(f"bundle {self.bundle.path.name} has no preprocessing spec; "
                                 "pass preprocessed arrays to infer()")
            self._preprocessor = Preprocessor(spec)
        return self._preprocessor

    def preprocess(self, images: Sequence) -> np.ndarray:
        """Images (paths, bytes or PIL images) -> NCHW float32 batch via the bundle's spec."""
        return self.preprocessor.batch(list(images))

    def top_k(self, logits: np.ndarray, k: int = 5) -> list[list[tuple[int, str, float]]]:
        """Per row: the k most probable classes as (index, label, probability) (softmax)."""
        if k < 1:
            raise UsageError("top_k must be at least 1")
        probs = softmax(logits)
        k = min(k, probs.shape[-1])
        order = np.argsort(-probs, axis=-1, kind="stable")[:, :k]
        labels = self.labels or []
        return [[(int(i), labels[i] if i < len(labels) else str(int(i)), float(row[i]))
                 for i in idx] for row, idx in zip(probs, order)]

    def classify(self, images: Iterable, top_k: int = 5) -> list[list[dict]]:
        """Top-k {index, label, score} for each image, through the bundle's preprocessing.

        ``images`` is a list of images (paths, encoded bytes or PIL images); one image
        given alone is a list of one (a path string is never split into characters)."""
        if isinstance(images, (str, os.PathLike, bytes, bytearray, memoryview)) or \
                type(images).__module__.startswith("PIL."):
            images = [images]
        batch = self.preprocess(list(images))
        logits = self.infer(batch)[self.outputs[0].name]
        return [[{"index": i, "label": label, "score": score} for i, label, score in row]
                for row in self.top_k(logits, top_k)]

    def close(self) -> None:
        self.runner.deactivate()
        self.bundle.close()

    def __enter__(self) -> "Model":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def load(path: str | os.PathLike, backend: str = "auto", device: int = 0, providers=None,
         verify: bool = True, trusted_keys=None, **options) -> Model:
    """Open and verify a bundle, check this host can run it, and start its engine.

    backend: "auto" runs the bundle's own engine target when this host can, else falls
    back to ONNX Runtime over the portable `model.onnx` (the reason is kept in
    `Model.fallback_reason` and logged). Naming a backend explicitly never falls back:
    a host that cannot run it gets a CompatibilityError that says what does not match.

    trusted_keys: a folder of trusted public keys / CA certificates (or a `TrustPolicy`):
    the bundle must carry a signature (`<bundle>.sig`) by one of them, checked before any
    engine is touched; None (default) checks no signature.
    """
    bundle = open_bundle(path)
    try:
        if verify:
            bundle.verify()
        check_trust(bundle, trusted_keys)
        target = bundle.manifest["engine"]["backend"]
        chosen = target if backend == "auto" else backend
        opts = dict(options, device=device, providers=providers)
        runner = runner_class(chosen)(bundle, **opts)
        fallback_reason = None
        try:
            runner.activate()
        except CompatibilityError as exc:
            if backend != "auto" or chosen == "onnxruntime":
                raise
            fallback_reason = f"{target} target not runnable here ({exc}); using onnxruntime"
            log.warning(fallback_reason)
            runner = runner_class("onnxruntime")(bundle, **opts)
            runner.activate()
        return Model(bundle, runner, fallback_reason)
    except BaseException:
        bundle.close()
        raise
