"""The peer of a study: what a user would run instead of a bundle, measured in the same run.

On a GPU that is the family's timm model, BatchNorm folded, in fp16 and channels_last,
compiled by ``torch.compile`` (Inductor, default mode: no max-autotune) and replayed as a
CUDA graph: the usual "make it fast" recipe. It takes float32 NCHW input like a bundle and
casts on the device inside the compiled function, so its boundaries are the bundle
runner's: ``graph_replay`` (input already on the device, synchronize per replay) and
``with_copies`` (pinned float32 host batch in, H2D, replay, D2H of the float32 logits).
Against uint8-input bundles (`bundle study --input uint8`) it takes the same uint8 NHWC
pixels and does the bundle head's arithmetic (``float(pixel) * scale + bias``, NCHW, fp16)
inside the compiled function, as a user shipping pixels to the GPU would.

Without a GPU the peer is the fp32 model in eager mode timed per call (boundary ``engine``),
which keeps `bundle study --peer` runnable in CI; speed figures from it say little.

Why in the study and not a separate script: the ratio bundle / peer is only fair when both
are timed in one process, one after the other, on the same inputs and weights.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from typing import TYPE_CHECKING

from runtime_py.errors import UsageError

if TYPE_CHECKING:
    import numpy as np

#: The peers `bundle study --peer` knows.
PEERS = ("torch-compile", "eager")
PEER_NOTES = {
    "torch-compile": "timm model, BN folded, fp16 channels_last, torch.compile (default mode), "
                     "CUDA graph replay",
    "eager": "timm model, BN folded, fp32, eager",
}


def peer_model(manifest: dict, checkpoint: str | os.PathLike | None = None):
    """The fp32 BN-folded torch model with the weights the bundle was made from."""
    from bundler.evaluate import weights_for_source
    from bundler.families import load_family
    from bundler.torch_model import build_torch_model

    family = load_family(manifest["family"]["name"])
    weights = weights_for_source(family, manifest["source"], checkpoint)
    return build_torch_model(family, weights.state_dict, weights.seed)


def peer_forward(model, dtype, pixel_scale_bias=None):
    """``model`` (channels_last, in ``dtype``) as the peer calls it: float32 NCHW in, cast
    on the device; or, with ``pixel_scale_bias`` (float32 (3,) arrays), uint8 NHWC pixels
    in, ``float(pixel) * scale + bias`` as the bundles' head computes it, then the cast.
    float32 logits out."""
    import torch

    if pixel_scale_bias is None:
        def forward(x):
            return model(x.to(dtype).contiguous(memory_format=torch.channels_last)).float()
        return forward
    device = next(model.parameters()).device
    scale, bias = (torch.from_numpy(v).to(device).reshape(1, 3, 1, 1) for v in pixel_scale_bias)

    def forward(x):     # NHWC pixels permuted: NCHW in channels_last strides
        x = x.permute(0, 3, 1, 2).to(torch.float32) * scale + bias
        return model(x.to(dtype)).float()
    return forward


class _CudaPeer:
    """fp16 channels_last model under torch.compile, one CUDA graph per batch size;
    ``pixel_scale_bias`` (float32 (3,) arrays): it takes uint8 NHWC pixels."""

    def __init__(self, model, mode: str, pixel_scale_bias=None) -> None:
        import torch

        self.torch = torch
        self.device = torch.device("cuda")
        half = model.to(self.device).half().to(memory_format=torch.channels_last)
        self.dtype = torch.float32 if pixel_scale_bias is None else torch.uint8
        self.host_dtype = "float32" if pixel_scale_bias is None else "uint8"
        forward = peer_forward(half, torch.float16, pixel_scale_bias)
        # static shapes (one specialization per batch size): the peer's best case
        self.fn = torch.compile(forward, dynamic=False) if mode == "torch-compile" else forward
        self.stream = torch.cuda.Stream(self.device)
        self.graphs: dict[int, tuple] = {}

    def _graph(self, n: int, shape: tuple[int, ...]):
        torch = self.torch
        if n not in self.graphs:
            x = torch.zeros((n, *shape), device=self.device, dtype=self.dtype)
            with torch.no_grad(), torch.cuda.stream(self.stream):
                for _ in range(3):             # compile, autotune-free warm-up, allocations
                    self.fn(x)
                self.stream.synchronize()
                graph = torch.cuda.CUDAGraph()
                with torch.cuda.graph(graph, stream=self.stream):
                    y = self.fn(x)
            self.graphs[n] = (graph, x, y)
        return self.graphs[n]

    def replay(self, n: int, shape: tuple[int, ...]) -> None:
        """One CUDA graph replay of batch ``n`` on the input already in the graph's buffer,
        synchronized: the engine-only boundary of ``timings``, for a profiler to watch."""
        graph, _, _ = self._graph(n, shape)
        with self.torch.cuda.stream(self.stream):
            graph.replay()
        self.stream.synchronize()

    def infer(self, batch: np.ndarray) -> np.ndarray:
        import numpy as np

        n = batch.shape[0]
        graph, x, y = self._graph(n, tuple(batch.shape[1:]))
        with self.torch.cuda.stream(self.stream):
            x.copy_(self.torch.from_numpy(np.ascontiguousarray(batch, self.host_dtype)))
            graph.replay()
            out = y.cpu().numpy().copy()
        return out

    def timings(self, n: int, shape: tuple[int, ...], iterations: int, warmup: int
                ) -> dict[str, list[float]]:
        from runtime_py.bench import time_boundaries

        torch, stream = self.torch, self.stream
        graph, x, y = self._graph(n, shape)
        host_in = torch.from_numpy(_timing_batch(n, shape, self.host_dtype)).pin_memory()
        host_out = torch.empty(tuple(y.shape), dtype=y.dtype).pin_memory()
        x.copy_(host_in)

        def with_copies() -> None:
            with torch.cuda.stream(stream):
                x.copy_(host_in, non_blocking=True)
                graph.replay()
                host_out.copy_(y, non_blocking=True)
            stream.synchronize()

        return time_boundaries({"graph_replay": lambda: self.replay(n, shape),
                                "with_copies": with_copies}, iterations, warmup)


class _CpuPeer:
    """fp32 eager model on the CPU (no GPU here): timed per call like a CPU runner;
    ``normalize`` (uint8 NHWC -> float32 NCHW, `Preprocessor.normalize`) for pixel input."""

    def __init__(self, model, normalize=None) -> None:
        import torch

        self.torch, self.model, self.normalize = torch, model, normalize
        self.host_dtype = "float32" if normalize is None else "uint8"

    def infer(self, batch: np.ndarray) -> np.ndarray:
        import numpy as np

        if self.normalize is not None:
            batch = self.normalize(np.ascontiguousarray(batch, np.uint8))
        with self.torch.no_grad():
            return self.model(self.torch.from_numpy(np.ascontiguousarray(batch, np.float32))
                              ).numpy()


def _timing_batch(n: int, shape: tuple[int, ...], dtype: str) -> np.ndarray:
    """The seeded batch the peer is timed on: the runners' `random_feeds` (uniform [-1, 1],
    or 0..255 pixels)."""
    from runtime_py.bench import random_feeds
    from runtime_py.tensors import TensorSpec

    return random_feeds([TensorSpec("x", dtype, ["batch", *shape])], n)["x"]


def make_peer(name: str, model, preprocess: dict | None = None) -> _CudaPeer | _CpuPeer:
    """The peer called ``name`` (one of `PEERS`) for the fp32 torch ``model``; taking uint8
    pixels when the bundles' preprocessing spec ``preprocess`` hands the engine pixels."""
    import torch

    from runtime_py.preprocess import Preprocessor

    if name not in PEERS:
        raise UsageError(f"unknown peer {name!r}: choose one of {', '.join(PEERS)}")
    pixels = Preprocessor(preprocess) if preprocess and preprocess["dtype"] == "uint8" else None
    if torch.cuda.is_available():
        return _CudaPeer(model, name, pixels.pixel_scale_bias if pixels else None)
    return _CpuPeer(model, pixels.normalize if pixels else None)


def measure_peer(name: str, manifest: dict, checkpoint, batch_sizes: Sequence[int],
                 timing: dict, inputs, ref_logits: np.ndarray, ref_stress: np.ndarray) -> dict:
    """The peer's study entry: timings per batch size, quality and stress vs the reference
    (``inputs``: the study's `bundler.study.EvalInputs`, whose preprocessing spec says
    whether the peer takes pixels)."""
    from bundler.evaluate import (logits_over, quality_figures, split_batches,
                                  stress_figures)
    from bundler.study import cpu_times
    from runtime_py.bench import DEVICE_TIMING_BOUNDARIES, figure

    peer = make_peer(name, peer_model(manifest, checkpoint), inputs.preprocess)
    shape = tuple(int(d) for d in manifest["inputs"][0]["shape"][1:])
    timings = []
    for b in batch_sizes:
        if isinstance(peer, _CudaPeer):
            raw = peer.timings(b, shape, timing["iterations"], timing["device_warmup"])
            timings += [figure(k, b, t, DEVICE_TIMING_BOUNDARIES[k]).as_dict()
                        for k, t in raw.items()]
        else:
            x = _timing_batch(b, shape, peer.host_dtype)
            t = cpu_times(lambda: peer.infer(x), timing)
            timings.append(figure("engine", b, t, "eager fp32 torch on host arrays").as_dict())
    logits = logits_over(peer.infer, inputs.batches())
    stress_logits = logits_over(peer.infer, split_batches(inputs.stress, 8))
    ran_on = "cuda" if isinstance(peer, _CudaPeer) else "cpu (fp32 eager: no GPU)"
    note = PEER_NOTES[name] if ran_on == "cuda" else PEER_NOTES["eager"]
    if peer.host_dtype == "uint8":
        note += "; uint8 NHWC pixels in, normalized " + (
            "inside the compiled function" if ran_on == "cuda" else "on the host")
    return {"label": f"peer: {name}", "name": name, "note": note, "input": peer.host_dtype,
            "ran_on": ran_on, "timings": timings,
            "quality": quality_figures(ref_logits, logits),
            "stress": stress_figures(inputs.stress_names, ref_stress, stress_logits)}


def peer_ratios(bundles: list[dict], peer: dict) -> list[dict]:
    """peer median time / bundle median time per bundle, batch size and boundary (> 1: the
    bundle is faster than what a user would otherwise run)."""
    peer_ms = {(f["boundary"], f["batch_size"]): f["median_ms"] for f in peer["timings"]}
    rows = []
    for b in bundles:
        if b["precision"] == "fp32":
            continue
        for f in b["timings"]:
            other = peer_ms.get((f["boundary"], f["batch_size"]))
            if other is not None:
                rows.append({"bundle": b["label"], "batch_size": f["batch_size"],
                             "boundary": f["boundary"], "peer_ms": other,
                             "bundle_ms": f["median_ms"], "ratio": other / f["median_ms"]})
    return rows
