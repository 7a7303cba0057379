"""Hand-written GPU kernels of the torch-aoti engine model (Triton), for what Inductor and
cuBLASLt do not give: an FP8 convolution that reads its input in place (``fp8_conv``).

Nothing here is imported at package import: ``fp8_conv`` imports triton, which a CPU-only
host may lack; ``available`` says whether it can be used, and why not.
"""

from __future__ import annotations

__all__ = ["available"]


def available() -> tuple[bool, str]:
    """(True, "") when the Triton FP8 convolution can be imported here, else (False, why)."""
    try:
        from bundler.targets.torch_aoti.kernels import fp8_conv  # noqa: F401
    except ImportError as e:
        return False, f"triton or torch.library.triton_op is missing ({e})"
    return True, ""
