"""trt-bundle's light runtime: open, verify, load and serve bundles.

Importing this package needs only numpy, msgpack, zstandard, safetensors, jsonschema and
pillow. Engines import their own packages (onnxruntime, tensorrt, torch) when used.
"""

from __future__ import annotations

from runtime_py.errors import BundleError
from runtime_py.format import Bundle, open_bundle

__version__ = "0.1.0"

__all__ = ["Bundle", "BundleError", "open_bundle", "load", "__version__"]


def load(path, backend: str = "auto", device: int = 0, providers=None, **options):
    """Open, verify and load a bundle for inference; see `runtime_py.model.load`.

    `trusted_keys=DIR` (in options) refuses a bundle that is not signed by one of them."""
    from runtime_py.model import load as _load

    return _load(path, backend=backend, device=device, providers=providers, **options)
