"""Command-line value types the benchmarks share."""

from __future__ import annotations

import argparse


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
