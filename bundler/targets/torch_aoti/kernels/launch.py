"""How the kernels' torch ops launch a Triton kernel, on every torch the project supports."""

from __future__ import annotations

from torch.library import wrap_triton
from triton.runtime.interpreter import InterpretedFunction


def traceable(kernel):
    """``wrap_triton(kernel)``, which lets torch.export trace the launch into the graph.

    Under ``TRITON_INTERPRET=1`` (the CPU tests) ``triton.jit`` makes an interpreted
    function, which runs eagerly and is never traced. torch 2.14's ``wrap_triton`` hands
    it back as it is; torch 2.11's (the H200's) refuses it ("only works on functions
    annotated with triton.jit"), so it is handed back here, the same on both."""
    if isinstance(kernel, InterpretedFunction):
        return kernel
    return wrap_triton(kernel)
