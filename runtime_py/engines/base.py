"""The runner interface every engine implements (after polygraphy's runners).

A runner is cheap to construct (it records the bundle and options); `activate()` does the
heavy work (create a session, deserialize a plan, load a package) and imports the engine's
package, so that importing `runtime_py` never needs onnxruntime, TensorRT or torch.
"""

from __future__ import annotations

import abc
from typing import Callable, Iterable

import numpy as np

from runtime_py.errors import BundleError, CompatibilityError, InferenceInputError, UsageError
from runtime_py.format import Bundle
from runtime_py.pending import Pending
from runtime_py.targets import get_target
from runtime_py.tensors import TensorSpec, check_feeds


def manifest_specs(entries: list[dict]) -> list[TensorSpec]:
    """TensorSpecs from the manifest's `inputs`/`outputs` entries."""
    return [TensorSpec(e["name"], e["dtype"], tuple(e["shape"])) for e in entries]


def require_own_engine(bundle: Bundle, backend: str, engine: str) -> None:
    """Refuse a bundle whose engine is not `backend`'s, saying what it holds instead.

    Only ONNX Runtime runs any bundle (every bundle carries `model.onnx`); a TensorRT or
    torch-aoti runner needs the bundle's own `engine.plan` / `engine.pt2`, which only a
    bundle made for that target holds (its manifest's engine backend). Checked before
    the engine's package is imported, so the message is the same on every host.
    """
    own = bundle.manifest["engine"]
    if own["backend"] == backend:        # its member is then checked when it is read
        return
    raise CompatibilityError(
        f"this bundle holds {article(own['backend'])} {own['backend']} engine "
        f"({own['member']}), not {engine}: run it with `--backend {own['backend']}` (or "
        f"`--backend auto`), or make a {backend} bundle from it on a host that has "
        f"{backend}: `bundle rebuild BUNDLE --backend {backend}`"
        + ("" if get_target(backend).from_onnx else
           " (with the weights it was made from: --checkpoint FILE, unless they are in the "
           "Hugging Face cache or the bundle has random weights)"))


def article(word: str) -> str:
    return "an" if word[:1].lower() in "aeio" else "a"


class Runner(abc.ABC):
    """One engine session over one bundle."""

    backend: str = ""

    def __init__(self, bundle: Bundle, **options: object) -> None:
        self.bundle = bundle
        self.options = options
        self.is_active = False
        self._inputs: list[TensorSpec] | None = None    # read once: infer asks every call
        self._outputs: list[TensorSpec] | None = None

    @property
    def max_batch_size(self) -> int:
        return int(self.bundle.manifest["batch"]["max"])

    @property
    def on_gpu(self) -> bool:
        """Whether the active engine computes on a GPU (host arrays are then copied to and
        from the device); false for an engine that computes on this host's CPU."""
        return False

    def input_metadata(self) -> list[TensorSpec]:
        if self._inputs is None:
            self._inputs = manifest_specs(self.bundle.manifest["inputs"])
        return list(self._inputs)

    def output_metadata(self) -> list[TensorSpec]:
        if self._outputs is None:
            self._outputs = manifest_specs(self.bundle.manifest["outputs"])
        return list(self._outputs)

    def activate(self) -> None:
        if not self.is_active:
            self.activate_impl()
            self.is_active = True

    def deactivate(self) -> None:
        if self.is_active:
            self.deactivate_impl()
            self.is_active = False

    def __enter__(self) -> "Runner":
        self.activate()
        return self

    def __exit__(self, *exc: object) -> None:
        self.deactivate()

    @abc.abstractmethod
    def activate_impl(self) -> None:
        """Create the engine session; raise EngineUnavailableError/CompatibilityError."""

    def deactivate_impl(self) -> None:
        """Release the engine session (default: nothing to release)."""

    def checked_batch(self, feeds: dict[str, np.ndarray]) -> int:
        """The batch size of ``feeds``, checked against the inputs and the engine's fixed
        range: engines hold buffers of ``max_batch_size`` (the model splits larger batches
        before they reach the engine)."""
        if not self.is_active:
            raise BundleError(f"the {self.backend} runner is not active: call activate() first")
        n = check_feeds(self.input_metadata(), feeds)
        if not 1 <= n <= self.max_batch_size:
            raise InferenceInputError(
                f"batch {n} is outside this {self.backend} engine's range "
                f"1..{self.max_batch_size}; the model splits larger batches before they "
                "reach the engine")
        return n

    def infer(self, feeds: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        """Run one batch (1..max_batch_size) and return the outputs by name; the outputs
        are the caller's own arrays (never views of buffers the runner reuses)."""
        return self.infer_impl(feeds, self.checked_batch(feeds))

    def infer_checked(self, feeds: dict[str, np.ndarray], n: int) -> dict[str, np.ndarray]:
        """``infer`` for a caller that has already run ``check_feeds`` on ``feeds`` against
        ``input_metadata()`` and found batch ``n`` (``Model.infer``): only the activity and
        range checks remain (a second full check costs tens of microseconds per call)."""
        if not self.is_active:
            raise BundleError(f"the {self.backend} runner is not active: call activate() first")
        if not 1 <= n <= self.max_batch_size:
            raise InferenceInputError(
                f"batch {n} is outside this {self.backend} engine's range 1..{self.max_batch_size}")
        return self.infer_impl(feeds, n)

    def infer_async(self, feeds: dict[str, np.ndarray]) -> "Pending":
        """Start one batch and return at once where the engine is asynchronous (GPU
        engines enqueue copies and compute on their streams); ``Pending.result()`` waits.

        The feeds must stay unchanged until ``result()`` returned (a buffer from
        ``input_buffers`` is read by the device copy in the meantime). Engines that run
        on the calling thread (ONNX Runtime) compute here and return a finished Pending.
        """
        n = self.checked_batch(feeds)
        return self.infer_async_impl(feeds, n)

    def infer_rows_async(self, parts: dict[str, list[np.ndarray]], staged_rows: int = 0,
                         staged_by: object = None) -> "Pending | None":
        """Start one batch given as each input's rows in pieces (a batcher's requests, in
        order), for engines that copy the pieces to the device where they lie; None, with
        nothing started, where this engine does not (the default): the caller then gathers
        the pieces into one array per input and calls ``infer_async``. The pieces must stay
        unchanged until ``result()`` returned. ``staged_rows``: the batch's first rows
        were handed to ``stage_rows`` by ``staged_by`` (and are these pieces' first rows);
        an engine whose next batch holds them copies only the rest."""
        return None

    #: rows that dispatches found staged (``stage_rows``) and did not copy again
    staged_rows_used = 0

    @property
    def stages_rows(self) -> bool:
        """Whether ``stage_rows`` takes rows (the default: never)."""
        return False

    def stage_rows(self, parts: dict[str, list[np.ndarray]], first_row: int,
                   staged_by: object) -> bool:
        """Start copying rows of the next ``infer_rows_async`` batch to the device before
        it is dispatched, as its rows ``first_row..`` (``staged_by``: the caller, named
        again at the dispatch); False, with nothing started, where this engine does not
        (the default). The pieces must stay unchanged until that batch's ``result()``."""
        return False

    def prepare(self, batch_sizes: "Iterable[int]",
                progress: Callable[[int, int], None] | None = None) -> None:
        """Set up now what the first batch of each size would (``Model.prepare``; an
        engine with work to do calls ``progress(done, total)`` after each size); the
        default has nothing to set up."""
        return None

    def pin_host(self, address: int, nbytes: int):
        """Page-lock host memory in place for this engine's device copies
        (``runtime_py.pinned_host.PinnedRange``); None (the default) where the engine has
        no device, or copies from page-locked memory no faster."""
        return None

    def input_buffers(self) -> dict[str, np.ndarray]:
        """Fresh host arrays of the max batch, one per input, for a caller to write a batch
        into (``buffers[name][:n]``) and pass to ``infer``/``infer_async``.

        GPU runners hand out page-locked (pinned) memory and use such feeds in place: the
        device copy reads them directly, with no staging copy. Elsewhere it is plain numpy
        memory. Each call allocates: keep the buffers and reuse them.
        """
        buffers = {}
        for spec in self.input_metadata():
            shape = (self.max_batch_size, *spec.shape[1:])
            if not all(isinstance(d, int) and d >= 0 for d in shape):
                raise UsageError(f"input {spec.name!r} has dynamic dimensions "
                                 f"{list(spec.shape)}; its buffers cannot be preallocated")
            buffers[spec.name] = self.allocate_host(shape, np.dtype(spec.dtype))
        return buffers

    def allocate_host(self, shape: tuple[int, ...], dtype: np.dtype) -> np.ndarray:
        """Host memory for ``input_buffers`` (GPU runners: pinned)."""
        return np.empty(shape, dtype)

    @abc.abstractmethod
    def infer_impl(self, feeds: dict[str, np.ndarray], n: int) -> dict[str, np.ndarray]:
        """Run one batch of ``n`` rows of already checked feeds."""

    def infer_async_impl(self, feeds: dict[str, np.ndarray], n: int) -> "Pending":
        """Default: compute now, on the calling thread."""
        try:
            return Pending.done(self.infer_impl(feeds, n))
        except Exception as exc:
            return Pending.failed(exc)
