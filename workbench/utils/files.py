"""Writing a run's small text files so that a failure names the file.

    write_text(out / "summary.md", text)

A full disk often shows only when the written text is flushed, and Python's error then
names no file (`OSError: [Errno 28] No space left on device`); `write_text` raises it
again with the path, so the CLI's one line says which file could not be written.
"""
from __future__ import annotations

from pathlib import Path

__all__ = ["write_text"]


def write_text(path: str | Path, text: str, encoding: str = "utf-8") -> Path:
    """`Path(path).write_text(text)`; an `OSError` that names no file is raised again naming `path`."""
    path = Path(path)
    try:
        path.write_text(text, encoding=encoding)
    except OSError as exc:
        if exc.filename is None and exc.errno is not None:
            raise OSError(exc.errno, exc.strerror, str(path)) from exc
        raise
    return path
