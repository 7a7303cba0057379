"""Which optional part of trt-bundle (a pip "extra") a job needs, checked before it starts.

A service installs only `trt-bundle[ort]`; making, rebuilding, evaluating and studying
bundles need `[export]` (torch, timm, onnx...), serving needs `[serve]`. A command that
cannot run on such an install says which extra to install (exit 5) instead of dying on a
`ModuleNotFoundError` half-way through its work.

The import names below mirror the extras of pyproject.toml (a test keeps them in sync).
Modules are looked up with `importlib.util.find_spec`, which finds a module without
importing it, so the check costs milliseconds even for torch.
"""

from __future__ import annotations

import importlib.util

from runtime_py.errors import MissingExtraError

#: extra -> the top-level modules it installs (import names, not distribution names).
EXTRA_MODULES: dict[str, tuple[str, ...]] = {
    "ort": ("onnxruntime",),
    "export": ("torch", "timm", "onnx", "onnx_graphsurgeon", "onnxscript", "ml_dtypes",
               "onnxruntime"),
    "serve": ("onnxruntime", "starlette", "uvicorn", "httptools", "uvloop", "prometheus_client",
              "grpc", "google", "tritonclient"),
    "study": ("matplotlib",),
    "trt": ("tensorrt", "cuda"),
    "sign": ("cryptography",),
    "deploy": ("tritonclient", "yaml"),
    "ray": ("ray", "onnxruntime", "starlette"),
}


def is_importable(module: str) -> bool:
    """Whether `import module` can find the module (it is not imported)."""
    try:
        return importlib.util.find_spec(module) is not None
    except (ImportError, ValueError):
        # ValueError: a module in sys.modules without a spec; ImportError: a finder refused.
        return False


def missing_modules(extra: str) -> list[str]:
    """The modules of `extra` that this install cannot import."""
    return [m for m in EXTRA_MODULES[extra] if not is_importable(m)]


def extra_for_module(module: str) -> str | None:
    """The extra that installs the top-level module of `module` (None: not an extra's)."""
    top = module.split(".", 1)[0]
    for extra in EXTRA_MODULES:        # the first extra that has it: ort before serve
        if top in EXTRA_MODULES[extra]:
            return extra
    return None


def install_hint(extra: str) -> str:
    return f"pip install 'trt-bundle[{extra}]'"


def require_extra(extra: str, job: str) -> None:
    """Raise MissingExtraError (exit 5) unless every module of `extra` is importable.

    `job` says what needs it, e.g. "`bundle make`".
    """
    missing = missing_modules(extra)
    if missing:
        raise MissingExtraError(
            f"{job} needs the '{extra}' extra, and this install lacks {', '.join(missing)}: "
            f"{install_hint(extra)}", extra=extra, missing=missing)
