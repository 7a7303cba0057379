"""Runs benchmarks/dw_kernel_variants.py's kernel variants under Triton's CPU interpreter
and prints JSON: for each variant, the share of its e4m3 codes that differ from the
shipped depthwise kernel's on the same layer (a bf16 view of GEMM rows, ReLU on the
input, partial tiles). Run by tests/test_dw_kernel_variants.py in a child process with
TRITON_INTERPRET=1 (tests/triton_interpret.py)."""

from __future__ import annotations

import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))

#: (channels, map size, batch): channels that leave a partial channel tile, a map that
#: leaves partial pixel tiles, 2-D blocks and row strips.
SHAPE = (40, 6, 2)
VARIANTS = ("const", "relu16", "acc16", "center", "copy", "rowbar", "evict", "b4x16",
            "same9", "row3", "rowsU2", "rowsU4", "tloop3", "blk4s3", "blk2s2t2", "gath2",
            "gathL3")
FP16_VARIANTS = ("sdot2", "sdotL3")


def main() -> None:
    import torch

    import dw_kernel_variants as v

    c, size, batch = SHAPE
    x, taps, bias, scale, cpad = v.inputs(c, size, batch, "cpu")
    block = (16, 16, 4)
    ref = v.run_variant("shipped", x, taps, bias, scale, cpad, block)
    out = {"nonzero": int((ref.view(torch.uint8) != 0).sum()), "total": ref.numel()}
    for name in VARIANTS:
        got = v.run_variant(name, x, taps, bias, scale, cpad, block)
        out[name] = float((got.view(torch.uint8) != ref.view(torch.uint8)).float().mean())
    # The shift-matrix variants on fp16 rows: the interpreter's tl.dot reads bf16 operands
    # as their integer bits (a numpy uint16), so bf16 is checked on the GPU only.
    x16 = x.half()
    ref16 = v.run_variant("shipped", x16, taps, bias, scale, cpad, block)
    for name in FP16_VARIANTS:
        got = v.run_variant(name, x16, taps, bias, scale, cpad, block)
        out[f"{name}-fp16"] = float((got.view(torch.uint8) != ref16.view(torch.uint8))
                                    .float().mean())
    print(json.dumps(out))


if __name__ == "__main__":
    main()
