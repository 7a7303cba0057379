"""Issue 18, timm_resnet50: does the fused FP8 model with its dense 1x1 layers on the TMA
kernel (``fp8_conv`` triton-fused-tma) export with Dynamo and compile with AOTInductor as the
build does it, and does the package equal eager? One GPU call, ~2-3 minutes, no bundle.

Why: a bundle build that fails says little (its log is on the lent machine); this runs the
build's own steps (``fused.rewrite_fused(tma=True)``, ``build.compile_package`` with its
strict export and options, ``build.smoke_check``) on random weights and constant scales,
and prints the first failure in full.

    python3 benchmarks/fused_tma_export.py [--export-only] [--static-batches 1]
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
import traceback
from pathlib import Path

if str(Path(__file__).resolve().parents[1]) not in sys.path:   # run as a script
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def fused_tma_model(tma: bool = True):
    """timm_resnet50 (random weights, seed 0) rewritten as the fp8 engine's fused model,
    every convolution but the stem FP8 with constant scales."""
    import numpy as np
    import torch

    from bundler.families import load_family
    from bundler.targets.torch_aoti.fused import rewrite_fused
    from bundler.targets.torch_aoti.nhwc_modules import EngineModule
    from bundler.torch_model import build_torch_model

    family = load_family("timm_resnet50")
    model = build_torch_model(family, seed=0)
    fp8 = {n: (0.05, np.full(m.out_channels, 2e-3, np.float32))
           for n, m in model.named_modules() if isinstance(m, torch.nn.Conv2d) and n != "conv1"}
    body = rewrite_fused(model, fp8, tma=tma)
    return EngineModule(body, torch.float16, False, True), tuple(family.input.shape)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--export-only", action="store_true", help="stop after torch.export")
    p.add_argument("--static-batches", default="", help="comma-separated, as the family's")
    args = p.parse_args()
    import torch

    if not torch.cuda.is_available():
        print("fused_tma_export.py needs a GPU (sm_90: TMA), and none is visible",
              file=sys.stderr)
        return 2
    from bundler.targets.torch_aoti.build import (compile_options_for, compile_package,
                                                  export_strict, smoke_check)
    from bundler.targets.torch_aoti.fp8_layers import exporting_batch
    from bundler.targets.torch_aoti.fused import uses_tma

    module, shape = fused_tma_model()
    module = module.cuda().eval()
    print(f"{torch.cuda.get_device_name()}, torch {torch.__version__}; TMA layers: "
          f"{sum(getattr(m, 'tma_tiles', None) is not None for m in module.modules())}, "
          f"strict export: {export_strict(module)}", flush=True)
    started = time.monotonic()
    try:
        if args.export_only:
            x = torch.randn(2, *shape, device="cuda")
            with torch.no_grad(), exporting_batch(None):
                program = torch.export.export(
                    module, (x,), dynamic_shapes=({0: torch.export.Dim("batch", max=32)},),
                    strict=uses_tma(module))
            kernels = [n for n in program.graph.nodes if "triton_kernel_wrapper" in str(n.target)]
            print(f"export ok in {time.monotonic() - started:.0f} s: {len(kernels)} Triton "
                  f"kernel nodes, TMA metadata of the first: "
                  f"{kernels[0].kwargs.get('tma_descriptor_metadata') if kernels else None}")
            return 0
        static = [int(n) for n in args.static_batches.split(",") if n]
        with tempfile.TemporaryDirectory() as tmp:
            path, toolchain = compile_package(
                module, shape, {"min": 1, "max": 32}, "cuda", compile_options_for(None),
                Path(tmp) / "fused-tma.pt2", static_batches=static)
            print(f"package {path.stat().st_size / 1e6:.1f} MB in "
                  f"{time.monotonic() - started:.0f} s ({toolchain})", flush=True)
            diffs = smoke_check(path, module, shape, [1, 4, 32], "cuda", static_batches=static)
        print("package vs eager, max |diff|:", {k: round(v, 5) for k, v in diffs.items()})
        return 0
    except Exception:
        print(f"FAILED after {time.monotonic() - started:.0f} s:", flush=True)
        traceback.print_exc(limit=8)
        return 1


if __name__ == "__main__":
    sys.exit(main())
