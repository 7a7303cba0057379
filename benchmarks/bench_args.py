"""Command-line value types the benchmarks share."""

from __future__ import annotations

import argparse
from typing import Callable


def positive_ints(text: str) -> list[int]:
    """``argparse`` type for "N[,N..]" (batch sizes, process counts): a value that is not a
    list of positive integers is a usage error with the value quoted, not a traceback."""
    try:
        values = [int(v) for v in text.split(",") if v.strip()]
    except ValueError:
        values = []
    if not values or min(values) < 1:
        raise argparse.ArgumentTypeError(f"one or more positive integers, got {text!r}")
    return values


def positive_int(text: str) -> int:
    """``argparse`` type for one positive integer (a repeat count)."""
    try:
        value = int(text)
    except ValueError:
        value = 0
    if value < 1:
        raise argparse.ArgumentTypeError(f"one positive integer, got {text!r}")
    return value


def names_of(choices: tuple[str, ...]) -> Callable[[str], list[str]]:
    """``argparse`` type for "NAME[,NAME..]" drawn from ``choices`` (servers, rules): an
    unknown name is a usage error listing the choices."""

    def parse(text: str) -> list[str]:
        values = [v.strip() for v in text.split(",") if v.strip()]
        bad = [v for v in values if v not in choices]
        if not values or bad:
            raise argparse.ArgumentTypeError(
                f"one or more of {', '.join(choices)}, got {text!r}")
        return values
    return parse


def stage_modes(text: str) -> list[str]:
    """``argparse`` type for ``--stage-ahead`` (serve_bench, serve_pair_bench): off, on or
    both (in the order given), each once."""
    modes = [m.strip() for m in text.split(",") if m.strip()]
    if not modes or len(set(modes)) != len(modes) or any(m not in ("off", "on") for m in modes):
        raise argparse.ArgumentTypeError(f"each mode must be off or on, once: got {text!r}")
    return modes
