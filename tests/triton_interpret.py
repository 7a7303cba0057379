"""Shared by the Triton kernel tests (test_fp8_conv_kernel.py, test_fp8_conv_fused.py): the
skip marker for hosts without triton, and running a script under Triton's CPU interpreter.

The interpreter is switched on by ``TRITON_INTERPRET=1`` when a kernel is decorated, so it
cannot be turned on inside a test process that may have imported the kernel already: each
script runs in a child process and prints its results as JSON.
"""

from __future__ import annotations

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


def run_interpreted(script: str, *args: str, folder: str = "tests") -> dict:
    """The JSON that ``<folder>/<script> ARGS`` prints under the interpreter (fails the test
    with the child's stderr if it exits non-zero); a benchmark probe takes
    ``folder="benchmarks"`` and its ``--interpret-check``."""
    env = {**os.environ, "TRITON_INTERPRET": "1",
           "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}
    proc = subprocess.run([sys.executable, str(ROOT / folder / script), *args],
                          capture_output=True, text=True, env=env, timeout=600, cwd=ROOT)
    if proc.returncode != 0:
        pytest.fail(f"the interpreter run of {script} failed:\n{proc.stderr[-3000:]}")
    return json.loads(proc.stdout)


def load_script(script: str) -> ModuleType:
    """``tests/<script>`` as a module (its case tables and builders), without running it."""
    spec = importlib.util.spec_from_file_location(Path(script).stem, ROOT / "tests" / script)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module
