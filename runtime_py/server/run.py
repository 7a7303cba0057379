"""Running the server: ``serve`` (blocking, for ``bundle serve``: HTTP with the built-in
HTTP/1.1 server (``http1``) or uvicorn, gRPC with the built-in HTTP/2 server (``grpc_h2``)
or grpcio, in this process or in front-end worker processes) and ``ServerThread`` (a
loopback HTTP server in a background thread, for tests and benchmarks).

``serve`` binds every port before it reports being ready, and owns the batchers it
creates: on SIGINT/SIGTERM the front-ends stop accepting and finish the requests in
flight, then the batchers are closed with ``drain=True`` so no accepted request is dropped.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import signal
import socket
import threading
import time
from typing import Any, Callable, Iterable, Mapping

import uvicorn

from ..batcher import Batcher
from ..compat import usable_cores
from ..errors import AddressInUseError, UsageError
from .app import DEFAULT_MAX_BODY_BYTES, create_engine_app
from .engine import Engine
from .gc_tuning import serving_gc


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
    max_wait_ms: float | None = None,
    early_dispatch: bool | str = False,
    stage_ahead: bool = False,
    grpc_port: int | None = None,
    workers: int = 0,
    max_queue: int = 1024,
    max_body_bytes: int = DEFAULT_MAX_BODY_BYTES,
    http_server: str = "builtin",
    grpc_server: str = "builtin",
    log_level: str = "info",
    access_log: bool = False,
    on_ready: Callable[[dict[str, str]], None] | None = None,
    stop: threading.Event | None = None,
    on_progress: Callable[[str], None] | None = None,
) -> None:
    """Serve ``models`` (a name -> model mapping, or models keyed by ``model.name``) until
    SIGINT/SIGTERM. ``max_batch`` defaults to each model's max batch size (and is capped
    to it). ``max_wait_ms``: how long a batch may wait for the last batch's clients
    (``Batcher``; None follows the engine's time per batch); ``early_dispatch``: cap that
    wait where the engine would run dry, or ``"auto"`` (``Batcher``); ``stage_ahead``: copy a
    batch's rows to the device while it collects (``Batcher``). HTTP always; gRPC too when
    ``grpc_port`` is given. ``workers`` > 0 runs that many front-end processes over this
    process's engine (``workers.serve_with_workers``); 0 runs the front-ends in this
    process. ``http_server``: ``"builtin"`` (``http1``: the
    inference body read from the socket straight into its buffer) or ``"uvicorn"``;
    ``grpc_server``: ``"builtin"`` (``grpc_h2``: the project's own HTTP/2, the message
    received straight into its buffer) or ``"grpcio"``.

    ``on_ready`` is called once every port is bound, with the addresses actually bound
    (``{"http": "http://host:port", "grpc": "host:port"}``), so ``--port 0`` can be told.
    A port that cannot be bound raises ``AddressInUseError`` before anything is served.
    ``stop``, when given, ends serving once set (for callers that run this on a thread,
    where signals cannot be caught). ``on_progress``, when given, is told in words how
    the models' preparation goes (``prepare_models``): a GPU engine's may take a minute.
    """
    check_http_server(http_server)
    check_grpc_server(grpc_server)
    named = _by_name(models)
    if not named:
        raise UsageError("no model to serve")
    batchers: dict[str, Batcher] = {}
    try:
        if on_progress is not None:
            prepare_models(named, max_batch, on_progress)
        for name, model in named.items():
            batchers[name] = Batcher(model, max_batch_size=capped_max_batch(max_batch, model),
                                     max_delay_ms=max_delay_ms, max_wait_ms=max_wait_ms,
                                     max_queue=max_queue, early_dispatch=early_dispatch,
                                     stage_ahead=stage_ahead)
        engine = Engine(named, batchers)
        http_sock = bind_http(host, port)
        try:
            if workers > 0:
                from .workers import serve_with_workers

                serve_with_workers(engine, http_sock, host, grpc_port, workers,
                                   max_body_bytes=max_body_bytes, log_level=log_level,
                                   access_log=access_log, on_ready=on_ready, stop=stop,
                                   http_server=http_server, grpc_server=grpc_server)
            else:
                run_async(_serve_here(engine, http_sock, host, grpc_port,
                                        max_body_bytes=max_body_bytes, log_level=log_level,
                                        access_log=access_log, on_ready=on_ready,
                                        stop=stop, http_server=http_server,
                                        grpc_server=grpc_server))
        finally:
            http_sock.close()
            engine.close()
    finally:
        for b in batchers.values():
            b.close(drain=True)


HTTP_SERVERS = ("builtin", "uvicorn")
GRPC_SERVERS = ("builtin", "grpcio")


def check_http_server(name: str) -> None:
    if name not in HTTP_SERVERS:
        raise UsageError(f"unknown HTTP server {name!r}; use one of {', '.join(HTTP_SERVERS)}")


def check_grpc_server(name: str) -> None:
    if name not in GRPC_SERVERS:
        raise UsageError(f"unknown gRPC server {name!r}; use one of {', '.join(GRPC_SERVERS)}")


def run_async(coro: Any) -> Any:
    """``asyncio.run`` on uvloop when it is installed (the ``serve`` extra has it): its
    event loop costs a fraction of asyncio's per request, which is most of a front-end's
    time with small tensors."""
    try:
        import uvloop
    except ImportError:
        return asyncio.run(coro)
    return uvloop.run(coro)


#: Seconds between two progress lines of one model's preparation.
PROGRESS_EVERY_S = 10.0


def prepare_models(named: Mapping[str, Any], max_batch: int | None,
                   say: Callable[[str], None], every_s: float = PROGRESS_EVERY_S,
                   first_after_s: float = 1.0) -> None:
    """Prepare each model for every batch size its batcher will take (``Model.prepare``,
    which the batcher would call silently), telling ``say`` how it goes: a line once a
    model's preparation has taken ``first_after_s``, then one every ``every_s``, then
    its total.
    The torch-aoti fp16 bundle of timm_xception spends ~73 s there on an H100 (its first
    run at each of 32 sizes; docs/measurements/h100-2026-12-05-d), and a server that
    says nothing for a minute looks hung. Quick preparations (onnxruntime: none) print
    nothing."""
    for name, model in named.items():
        prepare = getattr(model, "prepare", None)
        if prepare is None:
            continue
        top = capped_max_batch(max_batch, model) or int(model.max_batch_size)
        t0 = time.monotonic()
        said: list[float | None] = [None]      # when the last line was said

        def progress(done: int, total: int) -> None:
            now = time.monotonic()
            last = said[0]
            if now - t0 >= first_after_s and (last is None or now - last >= every_s):
                verb = "preparing" if last is not None else \
                    "preparing (CUDA graphs per batch size)"
                say(f"{verb} {name}: {done}/{total} batch sizes, {now - t0:.0f} s")
                said[0] = now
        if _takes_progress(prepare):
            prepare(range(1, top + 1), progress=progress)
        else:               # a model of the caller's own, prepare(batch_sizes) only
            prepare(range(1, top + 1))
        if said[0] is not None:
            say(f"prepared {name} for batch sizes 1..{top} in {time.monotonic() - t0:.0f} s")


def _takes_progress(prepare: Callable[..., None]) -> bool:
    """Whether a model's ``prepare`` takes ``progress=`` (``Model.prepare`` does; a
    ``BatchableModel`` of the caller's own may take the batch sizes alone)."""
    import inspect

    try:
        params = inspect.signature(prepare).parameters.values()
    except (TypeError, ValueError):
        return False
    return any(p.name == "progress" or p.kind is p.VAR_KEYWORD for p in params)


def capped_max_batch(max_batch: int | None, model: Any) -> int | None:
    """``max_batch`` limited to what the model's engine takes.

    A --max-batch above one model's max is capped for that model rather than refused:
    serving several bundles with one flag must not fail on the smallest (the CLI says so).
    """
    return None if max_batch is None else min(int(max_batch), int(model.max_batch_size))


def listening_socket(host: str, port: int, reuse_port: bool = False) -> socket.socket:
    """A TCP socket listening on ``host:port``, inheritable (workers get it by fd); raises
    ``OSError``. ``reuse_port``: share the port with other front-end processes."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        if reuse_port:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
        sock.bind((host, port))
        sock.listen(2048)
    except OSError:
        sock.close()
        raise
    sock.set_inheritable(True)
    return sock


def port_taken(protocol: str, host: str, port: int, e: OSError) -> AddressInUseError:
    """The error for a front-end port that cannot be listened on, naming the option that
    picks another (one message for HTTP and both gRPC servers)."""
    option = "--port" if protocol == "HTTP" else "--grpc-port"
    return AddressInUseError(
        f"cannot listen for {protocol} on {host}:{port}: {e.strerror or e}; stop what uses "
        f"the port or pick another with {option} (0 picks a free one)")


def bind_http(host: str, port: int) -> socket.socket:
    """A listening TCP socket on ``host:port``, or ``AddressInUseError`` saying why not."""
    try:
        return listening_socket(host, port)
    except OSError as e:
        raise port_taken("HTTP", host, port, e) from None


def bind_grpc(host: str, port: int, reuse_port: bool = False) -> socket.socket:
    """The gRPC port's listening socket (built-in server), or ``AddressInUseError``."""
    try:
        return listening_socket(host, port, reuse_port)
    except OSError as e:
        raise port_taken("gRPC", host, port, e) from None


def bound_port(sock: socket.socket) -> int:
    return sock.getsockname()[1]


def http_url(host: str, port: int) -> str:
    return f"http://[{host}]:{port}" if ":" in host else f"http://{host}:{port}"


async def run_front_ends(engine: Any, http_sock: socket.socket, host: str,
                         grpc_port: int | None, *, max_body_bytes: int, log_level: str,
                         access_log: bool, on_bound: Callable[[dict[str, str]], None]
                         | None = None, stop: threading.Event | None = None,
                         grpc_reuse_port: bool = False, http_server: str = "builtin",
                         grpc_server: str = "builtin", grpc_dealt: bool = False,
                         handoff: socket.socket | None = None) -> None:
    """HTTP (``http_server``, on the given socket) and gRPC (``grpc_server``) on one event
    loop, until a signal (caught on this loop, on the main thread) or ``stop``.

    ``handoff`` (a front-end worker): connections of the built-in servers are not
    accepted here but received, accepted, over this Unix socket from the engine process,
    which deals them out to its workers evenly (HTTP always, gRPC with ``grpc_dealt``)."""
    check_http_server(http_server)
    check_grpc_server(grpc_server)
    app = create_engine_app(engine, max_body_bytes=max_body_bytes)
    if http_server == "builtin":
        from .http1 import BuiltinHttpServer

        server = BuiltinHttpServer(app, access_log=access_log)
    else:
        config = uvicorn.Config(app, log_level=log_level, access_log=access_log,
                                lifespan="off")
        server = _QuietServer(config)
    loop = asyncio.get_running_loop()
    signals = (signal.SIGINT, signal.SIGTERM)
    if threading.current_thread() is not threading.main_thread():
        signals = ()   # a caller on another thread stops us through ``stop``

    def on_signal() -> None:
        server.force_exit = server.should_exit   # a second signal: stop waiting
        server.should_exit = True

    for sig in signals:
        loop.add_signal_handler(sig, on_signal)
    grpc_front: Any = None
    addresses = {"http": http_url(host, bound_port(http_sock))}
    if grpc_dealt:
        from .grpc_h2 import BuiltinGrpcServer

        grpc_front = BuiltinGrpcServer(engine, max_body_bytes)
    elif grpc_port is not None:
        grpc_front, bound = await start_grpc(grpc_server, engine, host, grpc_port,
                                             max_body_bytes, grpc_reuse_port)
        addresses["grpc"] = f"{host}:{bound}"
    async def watch_stop() -> None:
        while not stop.is_set():
            await asyncio.sleep(0.05)
        server.should_exit = True

    watcher = asyncio.create_task(watch_stop()) if stop is not None else None
    try:
        dealt_http = handoff is not None and http_server == "builtin"
        serving = asyncio.create_task(server.serve(sockets=[] if dealt_http else [http_sock]))
        if handoff is not None:
            servers = {b"c"[0]: server} if dealt_http else {}
            if grpc_dealt:
                servers[b"g"[0]] = grpc_front
            receive_connections(loop, handoff, servers,
                                getattr(engine, "connection_closed", None))
        while not server.started and not serving.done():
            await asyncio.sleep(0.01)
        if server.started and on_bound is not None:
            on_bound(addresses)
        await serving
    finally:
        if watcher is not None:
            watcher.cancel()
        if grpc_front is not None:
            await grpc_front.stop(grace=5.0)
        for sig in signals:
            loop.remove_signal_handler(sig)


async def start_grpc(kind: str, engine: Any, host: str, port: int, max_message_bytes: int,
                     reuse_port: bool = False) -> tuple[Any, int]:
    """A started gRPC server of ``kind`` on ``host:port`` (0 picks one): it and its port.
    Raises ``AddressInUseError`` when the address cannot be bound."""
    if kind == "grpcio":
        from .grpc_service import start_grpc_server

        try:
            return await start_grpc_server(engine, host, port, max_message_bytes, reuse_port)
        except OSError as e:
            raise port_taken("gRPC", host, port, e) from None
    from .grpc_h2 import BuiltinGrpcServer

    sock = bind_grpc(host, port, reuse_port)
    server = BuiltinGrpcServer(engine, max_message_bytes)
    await server.start(sock)
    return server, sock.getsockname()[1]


class _QuietServer(uvicorn.Server):
    """uvicorn without its signal handling: ``run_front_ends`` catches SIGINT/SIGTERM on
    its loop. uvicorn's own handlers re-raise the signal once it has stopped, which kills
    the process (exit 143 on SIGTERM) before the batchers drain and the models close."""

    @contextlib.contextmanager
    def capture_signals(self):   # uvicorn >= 0.29
        yield

    def install_signal_handlers(self) -> None:   # older uvicorn
        pass


def receive_connections(loop: asyncio.AbstractEventLoop, handoff: socket.socket,
                        servers: dict[int, Any],
                        on_closed: Callable[[int], None] | None = None) -> None:
    """Serve each connection the engine process sends over ``handoff`` (SCM_RIGHTS), by
    the server its tag byte names (``workers.deal_connections``: b"c" HTTP, b"g" gRPC).
    ``on_closed(tag)`` runs when one of them is gone (``RemoteEngine.connection_closed``
    tells the engine, which deals by connections open)."""
    handoff.setblocking(False)

    def on_readable() -> None:
        while True:
            try:
                data, fds, _, _ = socket.recv_fds(handoff, 256, 64)
            except (BlockingIOError, InterruptedError):
                return
            except OSError:
                data, fds = b"", []
            if not data and not fds:       # the engine closed its end: no more connections
                loop.remove_reader(handoff.fileno())
                return
            for i, fd in enumerate(fds):
                sock = socket.socket(fileno=fd)
                tag = data[i] if i < len(data) else b"c"[0]
                server = servers.get(tag)
                closed = None if on_closed is None else functools.partial(on_closed, tag)
                if server is None:
                    sock.close()
                    if closed is not None:
                        closed()
                    continue
                server.spawn(server.adopt(sock, closed))

    loop.add_reader(handoff.fileno(), on_readable)


async def _serve_here(engine: Engine, http_sock: socket.socket, host: str,
                      grpc_port: int | None, *, on_ready, stop, **options: Any) -> None:
    with serving_gc():
        await run_front_ends(engine, http_sock, host, grpc_port, on_bound=on_ready,
                             stop=stop, **options)


class ServerThread:
    """An HTTP server for ``app`` on a background thread; a context manager.

    ``http_server="uvicorn"`` (any ASGI app) or ``"builtin"`` (``http1``; ``app`` from
    ``create_app``/``create_engine_app``). ``port=0`` picks a free ephemeral port; ``url``
    is set once it listens. Startup and shutdown waits are bounded by ``timeout``.
    """

    def __init__(self, app: Any, host: str = "127.0.0.1", port: int = 0,
                 timeout: float = 10.0, http_server: str = "uvicorn", **config: Any) -> None:
        check_http_server(http_server)
        if http_server == "builtin":
            from .http1 import BuiltinHttpServer

            self.server = BuiltinHttpServer(app, host=host, port=port, **config)
        else:
            config.setdefault("log_level", "warning")
            config.setdefault("access_log", False)
            config.setdefault("lifespan", "off")
            self.server = uvicorn.Server(uvicorn.Config(app, host=host, port=port, **config))
        self.timeout = timeout
        self.host = host
        self.port: int | None = None
        self._thread = threading.Thread(target=self.server.run, name=f"http-{http_server}",
                                        daemon=True)

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


def default_workers() -> int:
    """Front-end worker processes for this host: 0 (parse in the engine process) on hosts
    with few cores, where extra processes only compete with the engine for them."""
    cores = usable_cores()
    return 0 if cores <= 2 else min(8, cores // 2)
