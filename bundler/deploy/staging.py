"""Writing folders of a repository all or nothing (a Triton model repository, manifests).

Every file is written under a hidden staging folder inside the target (same filesystem,
so the final step is a rename); only when all of them are written and checked is each
entry renamed into place. A failure before that leaves the target as it was (and removes
the target itself when this run created it); a failure between the renames puts back
what was already moved. A model server watching the repository therefore never sees a
model folder without its config or its engine file.
"""

from __future__ import annotations

import errno
import os
import shutil
import tempfile
from pathlib import Path

from bundler.writer import NO_ROOM, write_refused
from runtime_py.errors import UsageError


class StagedFolder:
    """Stage entries (files or folders) for ``target``; ``commit()`` renames them in.

    Use as a context manager: leaving the block without ``commit()`` (an exception)
    discards everything staged.
    """

    def __init__(self, target: str | os.PathLike, overwrite: bool = False) -> None:
        self.target = Path(target)
        self.overwrite = overwrite
        if self.target.exists() and not self.target.is_dir():
            raise UsageError(f"{self.target} is a file, not a folder: pass a folder")
        self._created_target = False
        self._stage: Path | None = None
        self._entries: list[str] = []

    def __enter__(self) -> "StagedFolder":
        if not self.target.exists():
            self.target.mkdir(parents=True)
            self._created_target = True
        self._stage = Path(tempfile.mkdtemp(prefix=".staging-", dir=self.target))
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        if self._stage is not None:
            shutil.rmtree(self._stage, ignore_errors=True)
            self._stage = None
        if exc_type is not None and self._created_target:
            shutil.rmtree(self.target, ignore_errors=True)
        if isinstance(exc, OSError) and exc.errno in NO_ROOM + (errno.EROFS,):
            # a full disk while copying an engine in: exit 6 naming the folder, no traceback
            raise write_refused(self.target, exc, "another folder") from exc

    def path(self, name: str) -> Path:
        """Where to write entry ``name`` (a top-level file or folder of the target)."""
        if self._stage is None:
            raise RuntimeError("StagedFolder used outside its `with` block")
        if not name or "/" in name or name.startswith("."):
            raise UsageError(f"{name!r} cannot be an entry of {self.target}")
        if name not in self._entries:
            self._entries.append(name)
        return self._stage / name

    def commit(self) -> list[Path]:
        """Rename every staged entry into the target; returns their final paths."""
        assert self._stage is not None
        existing = [n for n in self._entries if (self.target / n).exists()]
        if existing and not self.overwrite:
            raise UsageError(
                f"{', '.join(existing)} already exist(s) in {self.target}: pass --overwrite "
                "to replace them, or export into another folder")
        old = self._stage / ".replaced"
        old.mkdir()
        moved: list[str] = []
        replaced: list[str] = []
        try:
            for name in existing:
                os.replace(self.target / name, old / name)
                replaced.append(name)
            for name in self._entries:
                os.replace(self._stage / name, self.target / name)
                moved.append(name)
        except BaseException:
            for name in moved:
                os.replace(self.target / name, self._stage / name)
            for name in replaced:
                os.replace(old / name, self.target / name)
            raise
        return [self.target / n for n in self._entries]
