"""What static-batch graphs cost at make time: one torch-aoti package with the dynamic-batch
graph only, then one with static graphs for ``--static`` too, of the same model, side by
side in one process (family.json ``torch_aoti.static_batches``).

    python benchmarks/aoti_static_build.py [--model resnet18] [--static 1,8] [--device cpu]

Each build compiles into its own fresh Inductor cache (``TORCHINDUCTOR_CACHE_DIR``), so no
build reuses another's kernels; prints the build seconds and package bytes of each and
their ratios. The model is a timm model with random weights, fp32 on the CPU (the only
precision AOTInductor packages there), the precision of the family's fp16 engine on a GPU.
"""

from __future__ import annotations

import argparse
import os
import tempfile
import time


def build(model, precision: str, shape, batch: dict, device: str, static: list[int]
          ) -> tuple[float, int]:
    from bundler.targets.torch_aoti import build_engine

    with tempfile.TemporaryDirectory(prefix="aoti-static-cache-") as cache:
        previous = os.environ.get("TORCHINDUCTOR_CACHE_DIR")
        os.environ["TORCHINDUCTOR_CACHE_DIR"] = cache
        try:
            started = time.perf_counter()
            package, _ = build_engine(model, precision, shape, batch, device=device,
                                      static_batches=static, smoke=False)
            return time.perf_counter() - started, len(package)
        finally:
            if previous is None:
                os.environ.pop("TORCHINDUCTOR_CACHE_DIR", None)
            else:
                os.environ["TORCHINDUCTOR_CACHE_DIR"] = previous


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default="resnet18", help="timm model name (random weights)")
    parser.add_argument("--size", type=int, default=224, help="input height and width")
    parser.add_argument("--static", default="1,8", help="static batch sizes, comma-separated")
    parser.add_argument("--max-batch", type=int, default=8)
    parser.add_argument("--device", default="cpu", choices=("cpu", "cuda"))
    parser.add_argument("--precision", default=None, help="default: fp32 on cpu, fp16 on cuda")
    args = parser.parse_args()

    import timm
    import torch

    precision = args.precision or ("fp32" if args.device == "cpu" else "fp16")
    static = [int(n) for n in args.static.split(",") if n]
    torch.manual_seed(0)
    model = timm.create_model(args.model, pretrained=False).eval().requires_grad_(False)
    shape, batch = (3, args.size, args.size), {"min": 1, "max": args.max_batch}
    print(f"{args.model} {precision} on {args.device}, batch 1..{args.max_batch}, "
          f"torch {torch.__version__}, {os.cpu_count()} CPUs")
    plain_s, plain_bytes = build(model, precision, shape, batch, args.device, [])
    print(f"dynamic graph only:        {plain_s:7.1f} s  {plain_bytes / 1e6:8.1f} MB")
    static_s, static_bytes = build(model, precision, shape, batch, args.device, static)
    print(f"+ static graphs {','.join(map(str, static)):<10}{static_s:7.1f} s  "
          f"{static_bytes / 1e6:8.1f} MB")
    print(f"ratio (with / without):    {static_s / plain_s:7.2f}x {static_bytes / plain_bytes:8.2f}x")


if __name__ == "__main__":
    main()
