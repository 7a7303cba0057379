"""Running the app with uvicorn: ``serve`` (blocking, for ``bundle serve``) and
``ServerThread`` (a loopback server in a background thread, for tests and benchmarks).

``serve`` owns the batchers it creates: uvicorn stops accepting on SIGINT/SIGTERM and
finishes the requests in flight, then the batchers are closed with ``drain=True`` so no
accepted request is dropped.
"""

from __future__ import annotations

import threading
import time
from typing import Any, Iterable, Mapping

import uvicorn

from ..batcher import Batcher
from ..errors import UsageError
from .app import DEFAULT_MAX_BODY_BYTES, create_app


def _by_name(models: Mapping[str, Any] | Iterable[Any]) -> dict[str, Any]:
    if isinstance(models, Mapping):
        return dict(models)
    named: dict[str, Any] = {}
    for m in models:
        if m.name in named:
            raise UsageError(f"two models are both named {m.name!r}; serve each name once")
        named[m.name] = m
    return named


def serve(
    models: Mapping[str, Any] | Iterable[Any],
    host: str = "127.0.0.1",
    port: int = 8000,
    max_batch: int | None = None,
    max_delay_ms: float = 2.0,
    *,
    max_queue: int = 1024,
    max_body_bytes: int = DEFAULT_MAX_BODY_BYTES,
    log_level: str = "info",
    access_log: bool = False,
) -> None:
    """Serve ``models`` (a name -> model mapping, or models keyed by ``model.name``) until
    interrupted. ``max_batch`` defaults to each model's max batch size."""
    named = _by_name(models)
    if not named:
        raise UsageError("no model to serve")
    batchers: dict[str, Batcher] = {}
    try:
        for name, model in named.items():
            batchers[name] = Batcher(model, max_batch_size=_cap(max_batch, model),
                                     max_delay_ms=max_delay_ms, max_queue=max_queue)
        app = create_app(named, batchers, max_body_bytes=max_body_bytes)
        config = uvicorn.Config(app, host=host, port=port, log_level=log_level,
                                access_log=access_log, lifespan="off")
        uvicorn.Server(config).run()
    finally:
        for b in batchers.values():
            b.close(drain=True)


def _cap(max_batch: int | None, model: Any) -> int | None:
    # A --max-batch above what one model's engine takes is capped for that model rather
    # than refused: serving several bundles with one flag must not fail on the smallest.
    return None if max_batch is None else min(int(max_batch), int(model.max_batch_size))


class ServerThread:
    """A uvicorn server for ``app`` on a background thread; a context manager.

    ``port=0`` picks a free ephemeral port; ``url`` is set once it listens. Startup and
    shutdown waits are bounded by ``timeout``.
    """

    def __init__(self, app: Any, host: str = "127.0.0.1", port: int = 0,
                 timeout: float = 10.0, **config: Any) -> None:
        config.setdefault("log_level", "warning")
        config.setdefault("access_log", False)
        config.setdefault("lifespan", "off")
        self.server = uvicorn.Server(uvicorn.Config(app, host=host, port=port, **config))
        self.timeout = timeout
        self.host = host
        self.port: int | None = None
        self._thread = threading.Thread(target=self.server.run, name="uvicorn", daemon=True)

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"

    def start(self) -> "ServerThread":
        self._thread.start()
        deadline = time.monotonic() + self.timeout
        while not self.server.started:
            if not self._thread.is_alive():
                raise RuntimeError("the server thread exited during startup (see its log)")
            if time.monotonic() > deadline:
                self.stop()
                raise RuntimeError(f"the server did not start within {self.timeout} s")
            time.sleep(0.005)
        self.port = self.server.servers[0].sockets[0].getsockname()[1]
        return self

    def stop(self) -> None:
        self.server.should_exit = True
        self._thread.join(self.timeout)

    def __enter__(self) -> "ServerThread":
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
