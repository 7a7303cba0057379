"""A small numpy model with the ``Model`` interface, for tests and synthetic benchmarks.

The batcher and the server must be tested and measured without a real bundle (building one
takes minutes and an engine package). ``ToyModel`` is deterministic, depends on its whole
input (so a result delivered to the wrong client is caught), can simulate an engine's
fixed per-batch cost (``time.sleep``, which releases the GIL like a real engine call),
and has switches to fail chosen requests or to block until released.
"""

from __future__ import annotations

import io
import threading
import time

import numpy as np

from .errors import PreprocessError
from .staging import may_stage, rows_to_skip
from .tensors import TensorSpec, check_feeds

FAIL_VALUE = -7777.0
"""A row whose first input element equals this makes ``ToyModel.infer`` raise."""


class ToyModelError(RuntimeError):
    """What ``ToyModel.infer`` raises for a row marked with ``FAIL_VALUE``."""


class ToyModel:
    """logits = mean of the image over its spatial dims @ a fixed matrix.

    ``cost_ms`` + ``per_row_ms * batch`` is slept in every ``infer`` call; ``gate``, when
    set to a ``threading.Event``, makes ``infer`` wait for it; ``calls`` records the batch
    size of every call.
    """

    platform = "numpy"

    def __init__(
        self,
        name: str = "toy",
        *,
        num_classes: int = 10,
        channels: int = 3,
        size: int = 8,
        max_batch_size: int = 32,
        cost_ms: float = 0.0,
        per_row_ms: float = 0.0,
        version: str = "1",
        seed: int = 0,
        dtype: str = "float32",
    ) -> None:
        self.name = name
        self.version = version
        self.size = size
        self.max_batch_size = max_batch_size
        # dtype="uint8" stands in for a bundle whose engine takes uint8 pixels.
        self.inputs = [TensorSpec("input", dtype, ("batch", channels, size, size))]
        self.outputs = [TensorSpec("logits", "float32", ("batch", num_classes))]
        self.labels = [f"class_{i}" for i in range(num_classes)]
        self.weight = np.random.default_rng(seed).standard_normal(
            (channels, num_classes)).astype(np.float32)
        self.cost_s = cost_ms / 1000.0
        self.per_row_s = per_row_ms / 1000.0
        self.gate: threading.Event | None = None
        self.calls: list[int] = []
        self._lock = threading.Lock()

    def infer(self, feeds: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        """Run a batch of 1..max_batch_size rows (checked like a real engine would)."""
        n = check_feeds(self.inputs, feeds)
        if n > self.max_batch_size:
            raise ValueError(f"batch {n} exceeds the max batch size {self.max_batch_size}")
        with self._lock:
            self.calls.append(n)
        if self.gate is not None:
            self.gate.wait()
        x = feeds["input"]
        if np.any(x.reshape(n, -1)[:, 0] == FAIL_VALUE):
            raise ToyModelError("toy model asked to fail on this input")
        if self.cost_s or self.per_row_s:
            time.sleep(self.cost_s + self.per_row_s * n)
        return {"logits": self.reference(x)}

    def reference(self, x: np.ndarray) -> np.ndarray:
        """The exact computation of ``infer`` (for checking results).

        Row by row without BLAS, so a row's result is bit-identical whatever batch it ran in.
        """
        m = x.mean(axis=(2, 3), dtype=np.float32).astype(np.float32, copy=False)
        return (m[:, :, None] * self.weight[None]).sum(axis=1, dtype=np.float32)

    def preprocess(self, images: list[bytes]) -> np.ndarray:
        """Decode each image, resize to size x size, scale to [0, 1], NCHW float32."""
        from PIL import Image, UnidentifiedImageError

        out = np.empty((len(images), self.inputs[0].shape[1], self.size, self.size), np.float32)
        for i, data in enumerate(images):
            try:
                with Image.open(io.BytesIO(data)) as im:
                    im = im.convert("RGB").resize((self.size, self.size), Image.BILINEAR)
                    arr = np.asarray(im, dtype=np.float32) / 255.0
            except (UnidentifiedImageError, OSError, ValueError) as e:
                raise PreprocessError(f"image {i}: cannot decode ({e})") from e
            out[i] = arr.transpose(2, 0, 1)[: out.shape[1]]
        return out

    def top_k(self, logits: np.ndarray, k: int) -> list[list[tuple[int, str, float]]]:
        """Softmax, then the k best (index, label, probability) per row."""
        z = logits - logits.max(axis=1, keepdims=True)
        p = np.exp(z)
        p /= p.sum(axis=1, keepdims=True)
        k = min(k, p.shape[1])
        order = np.argsort(-p, axis=1, kind="stable")[:, :k]
        return [[(int(j), self.labels[j], float(row[j])) for j in idx]
                for row, idx in zip(p, order)]


class AsyncToyModel(ToyModel):
    """``ToyModel`` that behaves like a GPU engine towards its caller: ``infer_async``
    returns at once and the batch runs later on one private thread (the "stream"), which
    reads the input arrays only when it gets to them. A caller that rewrote an input
    buffer before the batch's ``Pending.result()`` returned gets wrong outputs, so tests
    of the batcher's buffer reuse catch it. ``input_buffers`` hands out plain arrays that
    the model remembers, like a GPU runner's pinned buffers; ``in_place`` counts feeds
    that were used in place. ``takes_rows=True`` adds ``infer_rows_async``, which takes a
    batch as its requests' rows where they lie and reads them late on the "stream", as
    the torch-aoti runner's device copies do (``row_batches`` records each batch's piece
    counts); ``takes_rows`` may also be a predicate on the pieces (False: declined, None
    returned, as a runner does for a batch size it has no graph for yet).
    ``stages_rows=True`` adds ``stage_rows`` as the runner has it: the rows of the next
    batch copied into one "device" buffer on the stream, late, and read from there by
    that batch for the rows its dispatch says were staged (``staged_batches`` records
    each ``infer_rows_async`` batch's rows taken from the buffer): a batcher that claims
    rows the buffer does not hold gets wrong outputs."""

    def __init__(self, *args, read_delay_ms: float = 0.0, takes_rows=False,
                 stages_rows: bool = False, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        from concurrent.futures import ThreadPoolExecutor

        from .hostcopy import HostBufferRegistry

        self.read_delay_s = read_delay_ms / 1000.0
        self._stream = ThreadPoolExecutor(1, thread_name_prefix="toy-stream")
        self._registry = HostBufferRegistry()
        self._owners: list[np.ndarray] = []
        self.in_place = 0
        self.max_in_flight = 0
        self._in_flight = 0
        self.takes_rows = takes_rows
        self.row_batches: list[int] = []
        self.stages_rows = stages_rows
        self.stage_calls = 0
        self.staged_batches: list[int] = []
        self.staged_rows_used = 0
        self._ahead: np.ndarray | None = None     # the next batch's staged "device" rows
        self._ahead_rows, self._ahead_by = 0, None

    def input_buffers(self) -> dict[str, np.ndarray]:
        spec = self.inputs[0]
        buf = np.empty((self.max_batch_size, *spec.shape[1:]), np.dtype(spec.dtype))
        self._owners.append(buf)
        self._registry.add(buf)
        return {spec.name: buf}

    def infer_async(self, feeds: dict[str, np.ndarray]):
        from .pending import Pending

        check_feeds(self.inputs, feeds)
        self._take_ahead()           # (this batch's rows overwrite what was staged)
        if self._registry.owner_of(feeds["input"]) is not None:
            with self._lock:
                self.in_place += 1
        with self._lock:
            self._in_flight += 1
            self.max_in_flight = max(self.max_in_flight, self._in_flight)

        def run():
            try:
                if self.read_delay_s:
                    time.sleep(self.read_delay_s)   # the "device" reads the input late
                return self.infer(feeds)
            finally:
                with self._lock:
                    self._in_flight -= 1

        future = self._stream.submit(run)
        return Pending(future.result)

    def infer_rows_async(self, parts: dict[str, list[np.ndarray]], staged_rows: int = 0,
                         staged_by: object = None):
        if not self.takes_rows or (callable(self.takes_rows) and not self.takes_rows(parts)):
            return None
        from .pending import Pending

        name = self.inputs[0].name
        pieces = parts[name]
        skip = rows_to_skip(staged_rows, staged_by, *self._take_ahead(),
                            sum(p.shape[0] for p in pieces))
        ahead = self._ahead
        with self._lock:
            self.row_batches.append(len(pieces))
            self.staged_batches.append(skip)
            self.staged_rows_used += skip

        def run():
            if self.read_delay_s:
                time.sleep(self.read_delay_s)       # the "device" copies the rows late
            rest = np.concatenate(pieces)[skip:]
            x = np.concatenate([ahead[:skip], rest]) if skip else rest
            return self.infer({name: x})

        return Pending(self._stream.submit(run).result)

    def stage_rows(self, parts: dict[str, list[np.ndarray]], first_row: int,
                   staged_by: object) -> bool:
        if not self.stages_rows:
            return False
        pieces = parts[self.inputs[0].name]
        n = sum(p.shape[0] for p in pieces)
        with self._lock:
            held = self._ahead_rows if self._ahead_by is staged_by else 0
            if not may_stage(first_row, n, held, self.max_batch_size):
                return False
            if self._ahead is None:
                spec = self.inputs[0]
                self._ahead = np.zeros((self.max_batch_size, *spec.shape[1:]),
                                       np.dtype(spec.dtype))
            ahead = self._ahead

            def copy():
                if self.read_delay_s:
                    time.sleep(self.read_delay_s / 4)
                ahead[first_row:first_row + n] = np.concatenate(pieces)

            self._stream.submit(copy)
            self._ahead_rows, self._ahead_by = first_row + n, staged_by
            self.stage_calls += 1
        return True

    def _take_ahead(self) -> tuple[int, object]:
        """The staged rows and their owner, handed to the batch being started."""
        with self._lock:
            taken = (self._ahead_rows, self._ahead_by)
            self._ahead_rows, self._ahead_by = 0, None
        return taken

    def close(self) -> None:
        self._stream.shutdown(wait=True)
