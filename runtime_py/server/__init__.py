"""The HTTP server: KServe v2 / Open Inference Protocol over the dynamic batcher.

Needs the ``serve`` extra (starlette, uvicorn, prometheus-client); nothing outside this
package imports them, so ``runtime_py`` stays importable without them.
"""

from .app import DEFAULT_MAX_BODY_BYTES, create_app, create_engine_app
from .engine import Engine
from .metrics import ServerMetrics
from .protocol import RequestError
from .run import ServerThread, serve

__all__ = ["create_app", "create_engine_app", "Engine", "serve", "ServerThread", "ServerMetrics", "RequestError",
           "DEFAULT_MAX_BODY_BYTES"]
