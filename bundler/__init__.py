"""trt-bundle's bundler: families -> ONNX -> precision graphs -> engines -> bundle files."""

__version__ = "0.1.0"
