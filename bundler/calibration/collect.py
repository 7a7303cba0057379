"""One pass of ONNX Runtime (CPU) over the calibration batches, reading only quantized tensors.

Why extra graph outputs on a copy: ONNX Runtime only returns graph outputs, and adding
every tensor would make it keep (and copy out) every intermediate activation. Only the
tensors that get a QuantizeLinear are added (untyped ``ValueInfoProto``: ORT infers the
type), the caller's model is not modified, and only those are fetched. Each batch updates
each tensor's :class:`~.histogram.TensorStats` with vectorised numpy (abs, scale, bincount).
The outputs land in buffers reused from batch to batch (see :class:`_Fetcher`), so memory
holds one batch of those tensors: with a 299x299 Xception about 80 MB per image (43
tensors, ~20 M floats), so keep the calibration batch small (<= 8).
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass

import numpy as np

from bundler.graphs.portable import portable_softmax
from runtime_py.errors import CalibrationError

from .calibrators import DEFAULT_PERCENTILE, check_method, compute_amax, scale_from_amax
from .histogram import TensorStats

@dataclass(frozen=True)
class CalibrationResult:
    """amax and scale (float32 values, as Python floats) per quantized activation tensor."""

    method: str
    amax: dict[str, float]
    scale: dict[str, float]
    images: int
    histogram_bins: int | None = None  # None for "max", which needs no histogram
    percentile: float | None = None


def _load_model(onnx_model):
    import onnx

    if isinstance(onnx_model, onnx.ModelProto):
        copy = onnx.ModelProto()
        copy.CopyFrom(onnx_model)
        return copy
    if isinstance(onnx_model, (bytes, bytearray)):
        return onnx.load_from_string(bytes(onnx_model))
    return onnx.load(os.fspath(onnx_model))


def _with_outputs(model, tensor_names: Sequence[str]):
    """Add exactly the missing ``tensor_names`` as graph outputs; refuse unknown names."""
    import onnx

    graph = model.graph
    produced = {name for node in graph.node for name in node.output}
    produced |= {i.name for i in graph.input}
    initializers = {i.name for i in graph.initializer}
    missing = [n for n in tensor_names if n not in produced or n in initializers]
    if missing:
        raise CalibrationError(
            f"{len(missing)} tensor(s) to calibrate are not activations of this graph: "
            f"{', '.join(missing[:5])}; the graph and the quantized tensor list do not match",
            problems=[f"not an activation of the graph: {n}" for n in missing],
        )
    outputs = {o.name for o in graph.output}
    for name in tensor_names:
        if name not in outputs:
            graph.output.append(onnx.ValueInfoProto(name=name))
            outputs.add(name)
    return model


def _session(model, intra_op_threads: int | None):
    import onnxruntime as ort

    from runtime_py.engines.onnxruntime import session_options

    # (the level whose ranges are the same with AVX2 and AVX-512: they are bundle bytes)
    options = session_options(ort, intra_op_threads=intra_op_threads, reproducible=True)
    return ort.InferenceSession(
        model.SerializeToString(), sess_options=options, providers=["CPUExecutionProvider"]
    )


class _Fetcher:
    """Runs the session and returns the requested tensors, into reused buffers.

    Why IOBinding: with plain ``run`` ORT allocates fresh memory for every extra output
    on every batch and copies it out (about 15 % over plain inference on Xception, whose
    43 quantized activations are ~20 M floats per image); bound to preallocated numpy
    buffers it writes straight into them (about 4 %). Buffers are made from the first
    batch's output shapes and reused for every batch of that size; a batch of another
    input shape (the last, shorter one) goes through plain ``run``. The returned arrays are
    overwritten by the next call: consume them before calling again.
    """

    def __init__(self, session, input_name: str, names: list[str]) -> None:
        self.session, self.input_name, self.names = session, input_name, names
        self.input_shape: tuple[int, ...] | None = None
        self.binding = None
        self.buffers: list[np.ndarray] = []

    def __call__(self, array: np.ndarray) -> list[np.ndarray]:
        if array.shape == self.input_shape:
            self.binding.bind_cpu_input(self.input_name, array)
            self.session.run_with_iobinding(self.binding)
            return self.buffers
        outputs = self.session.run(self.names, {self.input_name: array})
        if self.input_shape is None:
            self._bind(array.shape, outputs)
        return outputs

    def _bind(self, input_shape: tuple[int, ...], outputs: list[np.ndarray]) -> None:
        binding = self.session.io_binding()
        buffers = [np.empty_like(o, order="C") for o in outputs]
        for name, buffer in zip(self.names, buffers):
            binding.bind_output(
                name, "cpu", 0, buffer.dtype, list(buffer.shape), buffer.ctypes.data
            )
        self.binding, self.buffers, self.input_shape = binding, buffers, input_shape


_ORT_TO_NUMPY = {"tensor(float)": np.float32, "tensor(float16)": np.float16, "tensor(double)": np.float64}


def collect_statistics(
    onnx_model,
    tensor_names: Sequence[str],
    batches: Iterable,
    histogram_bins: int = 2048,
    intra_op_threads: int | None = None,
    progress: Callable[[int], None] | None = None,
) -> dict[str, TensorStats]:
    """Run the model once over ``batches`` and return |x| histogram + max per tensor.

    ``histogram_bins=0`` keeps the exact max only (enough for the ``max`` method).

    ``batches`` yields NCHW arrays, or tuples whose first element is one (as
    :meth:`CalibrationSet.iter_batches` gives). ``progress`` is called with the number of
    images done after each batch. The model must have exactly one input.
    """
    names = list(dict.fromkeys(tensor_names))
    if not names:
        raise CalibrationError("no tensors to calibrate: the FP8 recipe selected no layer")
    model = portable_softmax(_with_outputs(_load_model(onnx_model), names), copy=False)
    session = _session(model, intra_op_threads)
    inputs = session.get_inputs()
    if len(inputs) != 1:
        raise CalibrationError(
            f"calibration feeds one image tensor, but the graph has {len(inputs)} inputs"
        )
    input_name = inputs[0].name
    input_dtype = _ORT_TO_NUMPY.get(inputs[0].type, np.float32)
    stats = {name: TensorStats(name, bins=histogram_bins) for name in names}
    fetch = _Fetcher(session, input_name, names)
    images = 0
    for batch in batches:
        array = batch[0] if isinstance(batch, tuple) else batch
        array = np.ascontiguousarray(array, dtype=input_dtype)
        for name, value in zip(names, fetch(array)):
            stats[name].update(value)
        images += array.shape[0]
        if progress is not None:
            progress(images)
    if images == 0:
        raise CalibrationError("no calibration images: the calibration data gave no batch")
    return stats


def result_from_statistics(
    stats: dict[str, TensorStats],
    method: str,
    images: int,
    percentile: float = DEFAULT_PERCENTILE,
) -> CalibrationResult:
    """amax/scale per tensor from collected statistics (several methods can share a pass)."""
    check_method(method, percentile)
    amax = {name: compute_amax(s, method, percentile) for name, s in sorted(stats.items())}
    return CalibrationResult(
        method=method,
        amax=amax,
        scale={name: scale_from_amax(a) for name, a in amax.items()},
        images=images,
        histogram_bins=None if method == "max" else next(iter(stats.values())).bins,
        percentile=float(percentile) if method == "percentile" else None,
    )


def calibrate(
    onnx_model,
    tensor_names: Sequence[str],
    batches: Iterable,
    method: str = "max",
    percentile: float = DEFAULT_PERCENTILE,
    histogram_bins: int = 2048,
    intra_op_threads: int | None = None,
    progress: Callable[[int], None] | None = None,
) -> CalibrationResult:
    """Collect statistics in one pass and turn them into FP8 amax/scale per tensor.

    For ``max`` no histogram is built (``histogram_bins`` is ignored): it is not needed.
    """
    check_method(method, percentile)
    if method == "max":
        histogram_bins = 0
    done = [0]

    def count(images: int) -> None:
        done[0] = images
        if progress is not None:
            progress(images)

    stats = collect_statistics(
        onnx_model, tensor_names, batches, histogram_bins, intra_op_threads, count
    )
    return result_from_statistics(stats, method, done[0], percentile)
