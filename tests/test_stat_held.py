"""``runtime_py.stat_held``: stat(2) through the C library with the GIL kept, checked
against ``os.stat`` (the engine's loop checks a shared-memory region with it per request)."""

import os
import platform
import sys

import pytest

from runtime_py import stat_held


def test_it_agrees_with_os_stat_on_files_directories_and_missing_paths(tmp_path):
    f = tmp_path / "f.bin"
    f.write_bytes(b"x" * 12345)
    held = stat_held.stat_function()
    for path in (str(f), os.fsencode(f), str(tmp_path), "/dev/shm"):
        got = held(path)
        st = os.stat(path)
        assert got == (st.st_dev, st.st_ino, st.st_size)
    assert got.size == os.stat("/dev/shm").st_size
    assert held(str(tmp_path / "missing")) is None
    assert held(b"/nonexistent/dir/file") is None
    f.write_bytes(b"y")                          # a new size is seen at once
    assert held(str(f)).size == 1


@pytest.mark.skipif(sys.platform != "linux" or platform.machine() not in ("x86_64", "aarch64")
                    or platform.libc_ver()[0] != "glibc",
                    reason="the GIL-keeping binding is made for glibc on x86_64/aarch64 only")
def test_glibc_hosts_get_the_binding_that_keeps_the_gil():
    """Where the C library's stat is bound and agreed with os.stat, it is the one used:
    falling back to os.stat silently would bring back the GIL waits it exists to avoid."""
    assert stat_held.stat_function() is not stat_held.os_stat
    assert stat_held.stat_function() is stat_held.stat_function()


def test_os_stat_fallback_says_none_for_what_cannot_be_stated(tmp_path):
    assert stat_held.os_stat(str(tmp_path / "nope")) is None
    st = os.stat(tmp_path)
    assert stat_held.os_stat(str(tmp_path)) == (st.st_dev, st.st_ino, st.st_size)
