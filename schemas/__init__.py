"""JSON Schemas of trt-bundle, shipped as package data `runtime_py.schema_files`."""
