"""`bundle serve` tells how the models' preparation goes (``run.prepare_models``): a
GPU engine's CUDA graphs for every batch size took ~73 s for one fp16 bundle on an H100,
and a server that says nothing that long looks hung."""

from __future__ import annotations

import time

from runtime_py.server.run import prepare_models
from runtime_py.testing import ToyModel


class SlowPreparer:
    """A model whose preparation takes ``per_size_s`` a batch size and reports each."""

    def __init__(self, max_batch_size: int = 4, per_size_s: float = 0.0) -> None:
        self.max_batch_size = max_batch_size
        self.per_size_s = per_size_s
        self.prepared: list[int] = []

    def prepare(self, batch_sizes, progress=None) -> None:
        sizes = list(batch_sizes)
        for done, n in enumerate(sizes, 1):
            time.sleep(self.per_size_s)
            self.prepared.append(n)
            if progress is not None:
                progress(done, len(sizes))


def test_every_size_the_batcher_takes_is_prepared_and_told():
    lines: list[str] = []
    model = SlowPreparer(max_batch_size=4)
    prepare_models({"m": model}, None, lines.append, every_s=0.0, first_after_s=0.0)
    assert model.prepared == [1, 2, 3, 4]
    assert lines[0] == "preparing (CUDA graphs per batch size) m: 1/4 batch sizes, 0 s"
    assert lines[1:4] == [f"preparing m: {k}/4 batch sizes, 0 s" for k in (2, 3, 4)]
    assert lines[4] == "prepared m for batch sizes 1..4 in 0 s"


def test_max_batch_caps_the_sizes_prepared():
    lines: list[str] = []
    model = SlowPreparer(max_batch_size=8)
    prepare_models({"m": model}, 3, lines.append, every_s=0.0, first_after_s=0.0)
    assert model.prepared == [1, 2, 3]
    assert lines[-1] == "prepared m for batch sizes 1..3 in 0 s"


def test_a_model_whose_prepare_takes_no_progress_is_prepared_silently():
    """A model of the caller's own with ``prepare(batch_sizes)`` alone (the batcher's
    protocol before ``progress``) is still prepared, and nothing is said of it."""
    class OldStyle:
        max_batch_size = 3

        def __init__(self) -> None:
            self.prepared: list[int] = []

        def prepare(self, batch_sizes) -> None:
            time.sleep(0.05)
            self.prepared.extend(batch_sizes)

    lines: list[str] = []
    model = OldStyle()
    prepare_models({"old": model}, None, lines.append, every_s=0.0, first_after_s=0.0)
    assert model.prepared == [1, 2, 3] and lines == []


def test_lines_are_spaced_and_quick_preparations_say_nothing():
    lines: list[str] = []
    slow, quick, toy = SlowPreparer(4, per_size_s=0.1), SlowPreparer(4), ToyModel()
    prepare_models({"slow": slow, "quick": quick, "toy": toy}, None, lines.append,
                   every_s=1.0, first_after_s=0.15)
    assert quick.prepared == [1, 2, 3, 4]          # prepared, silently
    assert toy.max_batch_size                       # (no prepare: skipped)
    said = [line for line in lines if "slow" in line]
    assert said == lines                            # nothing about "quick" or the toy
    # one line once 0.15 s had passed, none in the next second, then the total
    assert len(said) == 2, said
    assert said[0].startswith("preparing (CUDA graphs per batch size) slow: ")
    assert said[1].startswith("prepared slow for batch sizes 1..4 in ")


def test_serve_prepares_and_says_so_before_it_serves():
    """``run.serve(on_progress=)`` (what `bundle serve` passes): every size prepared, and
    its lines said, before the server says it is up; the batcher then finds nothing left
    to prepare (the sizes are not prepared twice)."""
    import threading

    from runtime_py.server.run import serve

    class PreparedToy(ToyModel):
        def __init__(self) -> None:
            super().__init__("prep", max_batch_size=4)
            self.calls: list[list[int]] = []
            self.done: set[int] = set()

        def prepare(self, batch_sizes, progress=None) -> None:
            todo = [n for n in batch_sizes if n not in self.done]
            self.calls.append(todo)
            for k, n in enumerate(todo, 1):
                time.sleep(0.3)
                self.done.add(n)
                if progress is not None:
                    progress(k, len(todo))

    model, lines, ready, stop = PreparedToy(), [], threading.Event(), threading.Event()

    def on_ready(addresses) -> None:
        lines.append("up")
        ready.set()

    t = threading.Thread(target=serve, args=([model],), kwargs=dict(
        port=0, workers=0, log_level="warning", on_ready=on_ready, stop=stop,
        on_progress=lines.append), daemon=True)
    t.start()
    try:
        assert ready.wait(60)
    finally:
        stop.set()
        t.join(60)
    assert not t.is_alive()
    assert model.calls == [[1, 2, 3, 4], []]
    # 1.2 s of preparation: a line once a second had passed (at size 4, or 3 on a loaded
    # host), then the total
    assert len(lines) == 3 and lines[-1] == "up", lines
    assert lines[0].startswith("preparing (CUDA graphs per batch size) prep: ")
    assert "/4 batch sizes" in lines[0]
    assert lines[1].startswith("prepared prep for batch sizes 1..4 in ")


def test_a_batcher_logs_a_long_preparation(caplog):
    """A library user's ``Batcher(model)`` prepares silently, but one that took a second
    or more is logged at info level (the batcher's own ``prepare`` call)."""
    import logging

    from runtime_py.batcher import Batcher

    slow, quick = SlowPreparer(2, per_size_s=0.55), SlowPreparer(2)
    slow.name, quick.name = "slow-model", "quick-model"
    slow.inputs = quick.inputs = ToyModel().inputs
    with caplog.at_level(logging.INFO, logger="runtime_py.batcher"):
        for model in (slow, quick):
            Batcher(model).close()
    said = [r.getMessage() for r in caplog.records if "prepared" in r.getMessage()]
    assert slow.prepared == quick.prepared == [1, 2]
    assert len(said) == 1 and said[0].startswith(
        "batcher: prepared slow-model for batch sizes 1..2 in "), said
