"""Tensor descriptions and the one check of arrays against them.

``TensorSpec`` is how every layer (engines, model, batcher, server) describes an input or
output, so that metadata read from a manifest, reported by a runner and served over HTTP
is the same object.  ``check_feeds`` lives here rather than in the batcher because the
same rules apply to a direct ``Model.infer`` call: a request is refused with one message
that lists every problem, before it reaches an engine (where a bad shape would surface as
an opaque backend error, or worse, fail a whole merged batch).
"""

from __future__ import annotations

from typing import Mapping, NamedTuple, Sequence

import numpy as np

from .errors import InferenceInputError

Dim = int | str | None


class TensorSpec(NamedTuple):
    """One named tensor: numpy dtype name and shape.

    ``shape[0]`` is the batch axis. A dimension that is a string (``"batch"``, a symbolic
    name), ``None`` or a negative int is dynamic; a non-negative int is fixed.
    """

    name: str
    dtype: str
    shape: tuple[Dim, ...]


def is_dynamic(dim: Dim) -> bool:
    """True for a dimension any size may fill (symbolic name, ``None`` or ``-1``)."""
    return dim is None or isinstance(dim, str) or (isinstance(dim, int) and dim < 0)


def check_feeds(specs: Sequence[TensorSpec], feeds: Mapping[str, object]) -> int:
    """Check ``feeds`` against ``specs``; return the batch size they share.

    Checks names (missing and unexpected), that each value is a numpy array of exactly the
    spec's dtype (no silent casts: a float64 array sent to a float32 engine is almost
    always a client bug, and casting it would hide a copy), the rank, every fixed
    non-batch dimension, and that all inputs agree on a batch size of at least 1.
    Raises ``InferenceInputError`` listing every problem found.
    """
    problems: list[str] = []
    if not isinstance(feeds, Mapping):
        raise InferenceInputError(
            f"inputs must be a mapping of input name to array, got {type(feeds).__name__}"
        )
    expected = [s.name for s in specs]
    missing = [n for n in expected if n not in feeds]
    unexpected = [str(n) for n in feeds if n not in expected]
    if missing:
        problems.append(f"missing input(s) {missing}; the model takes {expected}")
    if unexpected:
        problems.append(f"unexpected input(s) {unexpected}; the model takes {expected}")
    batch_sizes: dict[str, int] = {}
    for spec in specs:
        if spec.name not in feeds:
            continue
        arr = feeds[spec.name]
        if not isinstance(arr, np.ndarray):
            problems.append(f"input {spec.name!r}: expected a numpy array, got {type(arr).__name__}")
            continue
        if arr.dtype != np.dtype(spec.dtype):
            problems.append(f"input {spec.name!r}: dtype {arr.dtype} but the model takes {spec.dtype}")
        if arr.ndim != len(spec.shape):
            hint = ""
            if arr.ndim == len(spec.shape) - 1 and all(
                    is_dynamic(want) or want == got for want, got in zip(spec.shape[1:], arr.shape)):
                hint = (f"; it looks like one item without the batch axis: pass "
                        f"x[None] (shape {[1, *arr.shape]})")
            problems.append(
                f"input {spec.name!r}: shape {list(arr.shape)} has {arr.ndim} dimensions, "
                f"the model takes {len(spec.shape)} ({_fmt_shape(spec.shape)}){hint}"
            )
            continue
        bad_dims = [
            i for i, (want, got) in enumerate(zip(spec.shape, arr.shape))
            if i > 0 and not is_dynamic(want) and want != got
        ]
        if bad_dims:
            problems.append(
                f"input {spec.name!r}: shape {list(arr.shape)} does not match "
                f"{_fmt_shape(spec.shape)} (dimension(s) {bad_dims})"
            )
        if arr.ndim == 0:
            problems.append(f"input {spec.name!r}: a scalar has no batch dimension")
            continue
        batch_sizes[spec.name] = int(arr.shape[0])
    sizes = set(batch_sizes.values())
    if len(sizes) > 1:
        problems.append(f"inputs disagree on the batch size: {batch_sizes}")
    elif sizes == {0}:
        problems.append("batch size is 0: send at least one item")
    if problems:
        raise InferenceInputError("; ".join(problems), problems=problems)
    return sizes.pop() if sizes else 0


class FeedChecker:
    """``check_feeds`` for one fixed list of specs, with a fast path for valid feeds.

    A batcher checks every request on the caller's thread; at tens of thousands of
    requests per second the generic check's cost shows. Valid feeds pass a precomputed
    comparison; anything else goes through ``check_feeds`` for its full message.
    """

    def __init__(self, specs: Sequence[TensorSpec]) -> None:
        self.specs = list(specs)
        # per input: name, dtype, rank, the fixed non-batch dims, and when every non-batch
        # dim is fixed, all of them as one tuple (one comparison instead of a generator)
        self._rules = []
        for s in self.specs:
            fixed = tuple((i, d) for i, d in enumerate(s.shape) if i > 0 and not is_dynamic(d))
            tail = tuple(d for _, d in fixed) if len(fixed) == len(s.shape) - 1 else None
            self._rules.append((s.name, np.dtype(s.dtype), len(s.shape), fixed, tail))

    def __call__(self, feeds: Mapping[str, object]) -> int:
        """The shared batch size of valid ``feeds``; raises ``InferenceInputError`` otherwise."""
        try:
            if len(feeds) == len(self._rules):
                n = -1
                for name, dtype, ndim, fixed, tail in self._rules:
                    arr = feeds[name]
                    shape = arr.shape  # type: ignore[union-attr]
                    if (type(arr) is not np.ndarray or arr.dtype != dtype or len(shape) != ndim
                            or ndim == 0 or (shape[1:] != tail if tail is not None
                                             else any(shape[i] != d for i, d in fixed))):
                        break
                    if n == -1:
                        n = shape[0]
                    elif shape[0] != n:
                        break
                else:
                    if n > 0:
                        return int(n)
        except (KeyError, TypeError, AttributeError):
            pass
        return check_feeds(self.specs, feeds)


def _fmt_shape(shape: Sequence[Dim]) -> str:
    return "[" + ", ".join("?" if d is None else str(d) for d in shape) + "]"
