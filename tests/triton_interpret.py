"""Shared by the Triton kernel tests (test_fp8_conv_kernel.py, test_fp8_conv_fused.py): the
skip marker for hosts without triton, and running a script under Triton's CPU interpreter.

The interpreter is switched on by ``TRITON_INTERPRET=1`` when a kernel is decorated, so it
cannot be turned on inside a test process that may have imported the kernel already: each
script runs in a child process and prints its results as JSON.
"""

from __future__ import annotations

import functools
import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path
from types import ModuleType

import pytest

ROOT = Path(__file__).resolve().parents[1]


def triton_missing() -> str | None:
    """Why the Triton kernels cannot run here, or None."""
    from bundler.targets.torch_aoti.kernels import available

    ok, why = available()
    return None if ok else why


TRITON_MISSING = triton_missing()
needs_triton = pytest.mark.skipif(TRITON_MISSING is not None,
                                  reason=f"needs triton: {TRITON_MISSING}")


def interpreter_env() -> dict:
    """A child's environment with the interpreter on and the checkout importable."""
    return {**os.environ, "TRITON_INTERPRET": "1",
            "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}


#: A kernel whose loop bound is a runtime argument, as every GEMM kernel's reduction loop.
LOOP_KERNEL = """
import torch, triton, triton.language as tl
@triton.jit
def count(out, n):
    acc = 0
    for _ in range(0, n):
        acc += 1
    tl.store(out, acc)
out = torch.zeros(1, dtype=torch.int32)
count[(1,)](out, 3)
assert out.item() == 3, out
"""


def probe_failure(source: str) -> str | None:
    """The last line a probe script (``source``) wrote to stderr under the interpreter when
    it failed, or None when it ran through."""
    proc = subprocess.run([sys.executable, "-c", source], capture_output=True, text=True,
                          env=interpreter_env(), timeout=300, cwd=ROOT)
    if proc.returncode == 0:
        return None
    return (proc.stderr.strip().splitlines() or ["no output"])[-1]


@functools.cache
def interpreter_broken() -> str | None:
    """Why Triton's interpreter itself cannot run the kernels here, or None. Triton 3.6 (with
    torch 2.11) takes a runtime loop bound with ``int()`` of a one-element array, which NumPy
    2.4 refuses ("only 0-dimensional arrays can be converted to Python scalars"); Triton 3.8
    (with torch 2.14) does not. Asked only after a script failed, so that a failure of our
    kernels is never taken for it."""
    last = probe_failure(LOOP_KERNEL)
    if last is None:
        return None
    import numpy
    import triton

    return (f"Triton {triton.__version__}'s interpreter cannot run a loop with a runtime bound "
            f"under NumPy {numpy.__version__} ({last[:160]}); Triton 3.8 (torch 2.14) can")


#: bf16 arithmetic on loaded values: a ReLU (maximum with 0) and a comparison.
BF16_KERNEL = """
import torch, triton, triton.language as tl
@triton.jit
def relu(x_ptr, out_ptr):
    offs = tl.arange(0, 4)
    a = tl.load(x_ptr + offs)
    tl.store(out_ptr + offs, tl.where(a > 0, tl.maximum(a, 0.0), 0.0))
x = torch.tensor([-2.0, -0.5, 0.5, 2.0], dtype=torch.bfloat16)
out = torch.empty_like(x)
relu[(1,)](x, out)
assert out.tolist() == [0.0, 0.0, 0.5, 2.0], out.tolist()
"""


@functools.cache
def interpreter_bf16_broken() -> str | None:
    """Why the interpreter cannot compute on bf16 values here, or None. Triton 3.9's (torch
    2.15) compares and takes the maximum of bf16 values as their 16-bit patterns (a numpy
    uint16), so every negative value passes a ReLU; Triton 3.8 (torch 2.14) does not. The
    compiled kernels are not concerned: only a variant that computes in bf16 is."""
    last = probe_failure(BF16_KERNEL)
    if last is None:
        return None
    import triton

    if not last.startswith("AssertionError"):     # it did not run at all: say what it said
        return f"Triton {triton.__version__}'s interpreter cannot run a bf16 kernel: {last[:200]}"
    return (f"Triton {triton.__version__}'s interpreter computes bf16 maximum and comparisons "
            f"on the values' bit patterns (a ReLU gave {last[16:][:80]}); Triton 3.8 "
            f"(torch 2.14) does not")


def run_interpreted(script: str, *args: str, folder: str = "tests") -> dict:
    """The JSON that ``<folder>/<script> ARGS`` prints under the interpreter (fails the test
    with the child's stderr if it exits non-zero, skips it if the interpreter itself cannot
    run here: ``interpreter_broken``); a benchmark probe takes ``folder="benchmarks"`` and
    its ``--interpret-check``."""
    proc = subprocess.run([sys.executable, str(ROOT / folder / script), *args],
                          capture_output=True, text=True, env=interpreter_env(), timeout=600,
                          cwd=ROOT)
    if proc.returncode != 0:
        broken = interpreter_broken()
        if broken:
            pytest.skip(broken)
        pytest.fail(f"the interpreter run of {script} failed:\n{proc.stderr[-3000:]}")
    return json.loads(proc.stdout)


def load_script(script: str) -> ModuleType:
    """``tests/<script>`` as a module (its case tables and builders), without running it."""
    spec = importlib.util.spec_from_file_location(Path(script).stem, ROOT / "tests" / script)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module
