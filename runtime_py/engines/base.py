"""The runner interface every engine implements (after polygraphy's runners).

A runner is cheap to construct (it records the bundle and options); `activate()` does the
heavy work (create a session, deserialize a plan, load a package) and imports the engine's
package, so that importing `runtime_py` never needs onnxruntime, TensorRT or torch.
"""

from __future__ import annotations

import abc

import numpy as np

from runtime_py.errors import BundleError, CompatibilityError, InferenceInputError
from runtime_py.format import Bundle
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
        + (" (torch-aoti: `bundle rebuild` prints the `bundle make` command)"
           if backend == "torch-aoti" else ""))


def article(word: str) -> str:
    return "an" if word[:1].lower() in "aeio" else "a"


class Runner(abc.ABC):
    """One engine session over one bundle."""

    backend: str = ""

    def __init__(self, bundle: Bundle, **options: object) -> None:
        self.bundle = bundle
        self.options = options
        self.is_active = False

    @property
    def max_batch_size(self) -> int:
        return int(self.bundle.manifest["batch"]["max"])

    def input_metadata(self) -> list[TensorSpec]:
        return manifest_specs(self.bundle.manifest["inputs"])

    def output_metadata(self) -> list[TensorSpec]:
        return manifest_specs(self.bundle.manifest["outputs"])

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

    def checked_batch(self, feeds: dict[str, np.ndarray], runner: str, engine: str) -> int:
        """The batch size of ``feeds``, checked against the inputs and the engine's fixed
        range: the GPU runners hold buffers of ``max_batch_size`` (the model splits larger
        batches before they reach the engine). ``runner``/``engine`` name them in messages."""
        if not self.is_active:
            raise BundleError(f"the {runner} runner is not active: call activate() first")
        n = check_feeds(self.input_metadata(), feeds)
        if not 1 <= n <= self.max_batch_size:
            raise InferenceInputError(
                f"batch {n} is outside this {engine}'s range 1..{self.max_batch_size}; the "
                "model splits larger batches before they reach the engine")
        return n

    @abc.abstractmethod
    def infer(self, feeds: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        """Run one batch (1..max_batch_size) of checked inputs; return outputs by name."""
