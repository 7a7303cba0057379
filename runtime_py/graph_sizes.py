"""Which batch sizes get a CUDA graph of their own, and which graph runs a batch of n.

A GPU runner captures one CUDA graph per batch size, and a server prepares every size
1..max before it serves (``Model.prepare``). Each size costs a first run before its
capture: milliseconds for a package of Triton kernels, but ~2.3 s for the torch-aoti fp16
bundle of timm_xception, whose convolutions cuDNN plans per shape: 73 s for 32 sizes on an
H100 (docs/measurements/h100-2026-12-05-d). With ``cuda_graph_sizes`` only the sizes listed
(and the max) get a graph, and a batch of n runs on the graph of the smallest listed size
>= n, its extra rows padding whose outputs are dropped (what vLLM does with its
``cudagraph_capture_sizes``). Fewer first runs at the start, some wasted rows on a batch
between two sizes. Rows are independent in these graphs (inference: no batch statistics),
so the padding's content never reaches a real row's output.
"""

from __future__ import annotations

from typing import Iterable

from .errors import UsageError


def parse_graph_sizes(sizes: "str | int | Iterable[int] | None", max_batch: int
                      ) -> tuple[int, ...] | None:
    """``cuda_graph_sizes`` as given (None: every size; "1,2,4,8"; an integer or
    integers) as the sorted sizes that get a graph, the max batch always among them.
    Sizes above ``max_batch`` are dropped, as ``--max-batch`` is capped per bundle: one
    list serves several bundles of different maxima. A size below 1, or one that is not
    an integer, is a usage error."""
    if sizes is None:
        return None
    items = sizes.split(",") if isinstance(sizes, str) else (
        [sizes] if isinstance(sizes, int) else list(sizes))
    values = []
    for item in items:
        if isinstance(item, str):
            item = item.strip()
            if not item:
                continue
            if not item.isdigit():
                values = None
                break
            item = int(item)
        if isinstance(item, bool) or not isinstance(item, int) or item < 1:
            values = None
            break
        values.append(item)
    if not values:
        raise UsageError(f"CUDA graph sizes must be positive integer batch sizes, got "
                         f"{sizes!r}")
    return tuple(sorted({v for v in values if v <= max_batch} | {int(max_batch)}))


def graph_batch(sizes: tuple[int, ...] | None, n: int) -> int:
    """The batch size whose graph runs a batch of ``n``: ``n`` itself with every size
    captured (None), else the smallest of ``sizes`` >= n (``n`` above them all: ``n``)."""
    if sizes is None:
        return n
    for s in sizes:
        if s >= n:
            return s
    return n
