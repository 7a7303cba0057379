"""Cost of the bundle format over the work it cannot avoid, and random access to members.

Figure 1, per bundle (ratio target <= 1.15):
    reader    = open_bundle(path) + verify() + close(): header, manifest id and schema,
                layout, then every member streamed through zstd and sha256.
    baseline  = zstd one-shot decompression of each member's stored bytes (read from the
                same file through an mmap) + hashlib.sha256 over the raw bytes (already in
                memory), timed separately and summed.
    Boundaries: the bundle is already on disk and in the page cache (a warm-up pass reads
    it); one thread; the two sides are measured in one loop, interleaved (A B, then B A)
    so that load from other processes hits both; the median over repeats is reported.
    Also reported: open + read_member of the big member (the bytes joined in memory).

Figure 2, random access: in a multi-member bundle (small members around a 100 MB one),
reading one small member touches only that member: the file is evicted from the page
cache (posix_fadvise DONTNEED, the file was fsynced), the member is read through a fresh
open_bundle, and mincore(2) says which bytes of the file are now cached (readahead of the
kernel included); plus warm read times of a small member next to the 100 MB one.

    python benchmarks/format_bench.py [--mb 100] [--repeats 9] [--dir /tmp]
"""

from __future__ import annotations

import argparse
import ctypes
import hashlib
import mmap
import os
import statistics
import tempfile
import time
from pathlib import Path

import numpy as np
import zstandard

from bundler.writer import write_bundle
from runtime_py.format import open_bundle

MB = 1_000_000


def body(name: str) -> dict:
    return {
        "name": name, "family": {"name": "bench", "version": "1"}, "precision": "fp32",
        "variant": None, "recipe": None, "source": {"kind": "random-weights", "seed": 0},
        "inputs": [{"name": "input", "dtype": "float32", "shape": ["batch", 3, 299, 299]}],
        "outputs": [{"name": "logits", "dtype": "float32", "shape": ["batch", 1000]}],
        "batch": {"min": 1, "opt": 8, "max": 32},
        "engine": {"backend": "onnxruntime", "member": "model.onnx", "details": {"opset": 19}},
        "build": {"tool": "trt-bundle", "tool_version": "bench", "packages": {},
                  "source_date_epoch": 0},
        "quality": None, "calibration": None, "rebuilt_from": None,
    }


def weights_like(n_bytes: int, seed: int = 0) -> bytes:
    """fp32 normal values like trained weights: poorly compressible (~1.1x)."""
    rng = np.random.default_rng(seed)
    return (rng.standard_normal(n_bytes // 4, dtype=np.float32) * 0.02).tobytes()


def compressible(n_bytes: int, seed: int = 1) -> bytes:
    """fp32 values on a 16-level grid (weights quantized then stored as fp32): ~4x."""
    rng = np.random.default_rng(seed)
    return (rng.integers(-8, 8, n_bytes // 4).astype(np.float32) * 0.01).tobytes()


def stored_views(path: Path) -> tuple[mmap.mmap, list[tuple[memoryview, int]]]:
    with open_bundle(path) as b:
        entries = [(m["offset"], m["stored_size"], m["raw_size"]) for m in b.manifest["members"]]
    with open(path, "rb") as f:
        mm = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
    return mm, [(memoryview(mm)[o:o + s], r) for o, s, r in entries]


def reader_verify(path: Path) -> None:
    with open_bundle(path) as b:
        b.verify()


def reader_read_big(path: Path, name: str) -> None:
    with open_bundle(path) as b:
        b.read_member(name)


def measure(path: Path, big: str, repeats: int) -> dict:
    mm, views = stored_views(path)
    raws = [zstandard.ZstdDecompressor().decompress(v, max_output_size=r) for v, r in views]
    reader_verify(path)                                        # warm the page cache
    t_reader, t_read, t_dec, t_sha = [], [], [], []

    def one_reader():
        t0 = time.perf_counter()
        reader_verify(path)
        t_reader.append(time.perf_counter() - t0)
        t0 = time.perf_counter()
        reader_read_big(path, big)
        t_read.append(time.perf_counter() - t0)

    def one_baseline():
        dctx = zstandard.ZstdDecompressor()
        t0 = time.perf_counter()
        for v, r in views:
            dctx.decompress(v, max_output_size=r)
        t_dec.append(time.perf_counter() - t0)
        t0 = time.perf_counter()
        for raw in raws:
            hashlib.sha256(raw).digest()
        t_sha.append(time.perf_counter() - t0)

    for i in range(repeats):
        for step in ((one_reader, one_baseline) if i % 2 == 0 else (one_baseline, one_reader)):
            step()
    for v, _ in views:
        v.release()
    mm.close()
    med = statistics.median
    baseline = [d + s for d, s in zip(t_dec, t_sha)]
    raw_total = sum(len(r) for r in raws)
    return {"reader": med(t_reader), "read": med(t_read), "dec": med(t_dec), "sha": med(t_sha),
            "baseline": med(baseline), "ratio": med(t_reader) / med(baseline),
            "read_ratio": med(t_read) / med(baseline), "raw": raw_total,
            "stored": path.stat().st_size}


# --- page-cache residency (Linux) -------------------------------------------------------------

_libc = ctypes.CDLL(None, use_errno=True)
_libc.mincore.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.POINTER(ctypes.c_ubyte)]
_libc.mmap.restype = ctypes.c_void_p
_libc.mmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int,
                       ctypes.c_int, ctypes.c_long]
_libc.munmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t]


def resident(path: Path) -> np.ndarray:
    """Boolean per page of `path`: is it in the page cache (mincore on a fresh mapping)."""
    size = path.stat().st_size
    fd = os.open(path, os.O_RDONLY)
    try:
        addr = _libc.mmap(None, size, mmap.PROT_READ, mmap.MAP_SHARED, fd, 0)
        if addr in (None, ctypes.c_void_p(-1).value):
            raise OSError(ctypes.get_errno(), "mmap failed")
        pages = (size + mmap.PAGESIZE - 1) // mmap.PAGESIZE
        vec = (ctypes.c_ubyte * pages)()
        if _libc.mincore(addr, size, vec) != 0:
            raise OSError(ctypes.get_errno(), "mincore failed")
        _libc.munmap(addr, size)
        return np.frombuffer(bytes(vec), dtype=np.uint8).astype(bool) if pages else np.zeros(0, bool)
    finally:
        os.close(fd)


def evict(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
    finally:
        os.close(fd)


def random_access(path: Path, small: str, big: str, repeats: int) -> None:
    with open_bundle(path) as b:
        entries = {m["name"]: m for m in b.manifest["members"]}
    page = mmap.PAGESIZE

    def cached_bytes_per_member(res: np.ndarray) -> dict[str, int]:
        out = {}
        for name, m in entries.items():
            first, last = m["offset"] // page, (m["offset"] + m["stored_size"] - 1) // page
            out[name] = int(res[first:last + 1].sum()) * page
        return out

    print(f"\nrandom access in {path.name} ({path.stat().st_size / MB:.1f} MB file):")
    for name in (small, big):
        evict(path)
        before = resident(path)
        with open_bundle(path) as b:
            data = b.read_member(name)
        after = resident(path)
        per = cached_bytes_per_member(after)
        print(f"  cold read of {name!r} ({len(data):,} raw bytes, "
              f"{entries[name]['stored_size']:,} stored): page cache before {int(before.sum()) * page:,} B, "
              f"after {int(after.sum()) * page:,} B of the file")
        for other, n in per.items():
            print(f"      {other:<24} {entries[other]['stored_size']:>12,} stored  {n:>12,} B cached")
    times = {small: [], big: []}
    with open_bundle(path) as b:
        b.verify()                                              # warm
        for i in range(repeats):
            for name in ((small, big) if i % 2 == 0 else (big, small)):
                t0 = time.perf_counter()
                b.read_member(name)
                times[name].append(time.perf_counter() - t0)
    for name, t in times.items():
        print(f"  warm read_member({name!r}): median {statistics.median(t) * 1e3:.3f} ms")


def report(label: str, r: dict) -> None:
    gbs = r["raw"] / 1e9
    print(f"\n{label}: {r['raw'] / MB:.0f} MB raw, {r['stored'] / MB:.1f} MB file "
          f"(x{r['raw'] / r['stored']:.2f})")
    print(f"  reader open+verify      {r['reader'] * 1e3:8.1f} ms  ({gbs / r['reader']:.2f} GB/s raw)")
    print(f"  baseline dec+sha256     {r['baseline'] * 1e3:8.1f} ms  "
          f"(zstd {r['dec'] * 1e3:.1f} + sha256 {r['sha'] * 1e3:.1f})")
    print(f"  RATIO open+verify / baseline = {r['ratio']:.3f}   (target <= 1.15)")
    print(f"  open+read_member (joined)  {r['read'] * 1e3:8.1f} ms  ratio {r['read_ratio']:.3f}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--mb", type=int, default=100, help="size of the big member in MB")
    ap.add_argument("--repeats", type=int, default=9)
    ap.add_argument("--dir", default=None, help="folder for the bundles (default: a temp dir)")
    args = ap.parse_args()
    n = args.mb * MB
    print(f"format bench: {args.mb} MB member, {args.repeats} interleaved repeats, medians; "
          f"zstandard {zstandard.__version__} (libzstd {zstandard.ZSTD_VERSION}), "
          f"{os.cpu_count()} CPUs, load average {os.getloadavg()[0]:.2f}")
    with tempfile.TemporaryDirectory(dir=args.dir) as tmp:
        d = Path(tmp)
        rng = np.random.default_rng(9)
        cases = {
            "weights-like fp32 (poorly compressible)": {"model.onnx": weights_like(n)},
            "compressible fp32 (16-level grid)": {"model.onnx": compressible(n)},
            "multi-member": {
                "labels.msgpack": b"".join(b"\xaaclass_%04d" % i for i in range(1000)),
                "model.onnx": weights_like(n, seed=3),
                "preprocess.msgpack": b"\x81\xa4size\xcd\x01\x2b" * 10,
                "reference.safetensors": rng.standard_normal(1 << 18, dtype=np.float32).tobytes(),
            },
        }
        paths = {}
        for i, (label, members) in enumerate(cases.items()):
            t0 = time.perf_counter()
            path, _ = write_bundle(d / f"bench{i}.bundle", body(f"bench{i}"), members)
            print(f"wrote {path.name} in {time.perf_counter() - t0:.2f} s")
            paths[label] = path
            del members
        cases.clear()
        for label, path in paths.items():
            report(label, measure(path, "model.onnx", args.repeats))
        random_access(paths["multi-member"], "labels.msgpack", "model.onnx", args.repeats)
        random_access(paths["multi-member"], "preprocess.msgpack", "model.onnx", 1)


if __name__ == "__main__":
    main()
