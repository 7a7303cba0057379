"""The torch-aoti engine target (one folder): ``build`` (the target: check_host,
build_target, build_engine), ``reuse`` (what a bundle must record to be reused as this
build's), ``model`` (the torch model rewrite it compiles, imports torch) and ``toolchain``
(the C++ toolchain AOTInductor links with). Importing this package imports no torch."""

from bundler.targets.torch_aoti.build import (build_engine, build_target, check_host,  # noqa: F401
                                              compile_options_for, default_nhwc,
                                              default_pad_channels, engine_details,
                                              engine_model, host_details, pixel_head,
                                              static_sizes)
from bundler.targets.torch_aoti.reuse import reuse_checks  # noqa: F401
