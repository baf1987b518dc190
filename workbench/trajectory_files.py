"""A trajectory batch's file: the JSONL (optionally gzip) lines `TrajectoryBatch.save` writes
and `TrajectoryBatch.load` reads, streamed with limits so that a file which is not a batch (a
gzip bomb, a wrong file) is refused by name before it fills memory.

Core layer, beside `workbench.trajectory` (which builds the batch from these records).
"""
from __future__ import annotations

import gzip
import itertools
import json
import os
from pathlib import Path
from typing import Any

#: The most decompressed bytes `TrajectoryBatch.load` reads from one file (2 GiB: a saved
#: batch takes about 100-300 bytes per token with every field, so millions of tokens).
MAX_LOAD_BYTES = 2 * 1024**3
#: The longest line (one episode) `TrajectoryBatch.load` reads (256 MiB: an episode of
#: about a million tokens).
MAX_LINE_BYTES = 256 * 1024**2


class NotABatchFile(ValueError):
    """`TrajectoryBatch.load` was given a file that does not start with the header `save`
    writes (another file, an empty one); the message names the file."""


class BatchTooLarge(ValueError):
    """A batch file decompresses to more than `TrajectoryBatch.load` reads (`MAX_LOAD_BYTES`
    in all, `MAX_LINE_BYTES` in one line); the message names the file and the limit."""


def jsonable(value: Any) -> Any:
    """A JSON-able stand-in for a value `json` cannot write (its `default=` hook): numpy
    arrays and tensors as nested lists (`tolist`), numpy scalars as numbers (`item`),
    sets as sorted lists, bytes decoded (invalid UTF-8 replaced), anything else its repr."""
    if hasattr(value, "tolist"):
        return value.tolist()
    if hasattr(value, "item"):
        return value.item()
    if isinstance(value, (set, frozenset)):
        return sorted(value, key=repr)
    if isinstance(value, (bytes, bytearray)):
        return bytes(value).decode("utf-8", "replace")
    return repr(value)


def write_records(path: Path, header: dict[str, Any], records: Any, compresslevel: int = 9) -> None:
    """Write `header` and then each record of `records` as one JSON line (gzip at `compresslevel`
    when the name ends in ".gz"), beside `path` first and then renamed into place, so a reader
    never sees half of the file and a failed write leaves none behind."""
    tmp = path.with_name(f".{path.name}.tmp")
    try:
        with open_text(tmp, "w", compresslevel) as f:
            f.write(json.dumps(header, default=jsonable) + "\n")
            for record in records:
                f.write(json.dumps(record, default=jsonable) + "\n")
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


def read_records(path: Path, max_bytes: int | None = None,
                 max_line_bytes: int | None = None) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """The header and the episode records of the batch file `path` (see `TrajectoryBatch.load`
    for the limits and the errors)."""
    limit = MAX_LOAD_BYTES if max_bytes is None else max_bytes
    line_limit = MAX_LINE_BYTES if max_line_bytes is None else max_line_bytes
    records: list[dict[str, Any]] = []
    header: dict[str, Any] | None = None
    total = 0
    with (gzip.open(path, "rb") if path.name.endswith(".gz") else path.open("rb")) as f:
        for number in itertools.count(1):
            parts, size = _line_parts(f, line_limit)
            if not size:
                break
            total += size
            if size > line_limit:
                raise BatchTooLarge(
                    f"{path} line {number} is longer than {line_limit} bytes (max_line_bytes) once "
                    "decompressed; one line holds one episode and none is that long, so this is not a "
                    "batch written by TrajectoryBatch.save (a gzip bomb?). Reading stopped there; for a "
                    "real batch this big pass a larger max_line_bytes to TrajectoryBatch.load")
            if total > limit:
                raise BatchTooLarge(
                    f"{path} decompresses to more than {limit} bytes (max_bytes); reading stopped there "
                    "(a gzip bomb, or not a batch file?). For a real batch this big pass a larger "
                    "max_bytes to TrajectoryBatch.load")
            line = b"".join(parts)
            try:
                record = json.loads(line)
            except ValueError as exc:  # JSONDecodeError, or bytes that are not UTF-8
                if header is None:
                    raise NotABatchFile(f"{path} is not a workbench trajectory batch file: its first line is "
                                        f"not JSON ({type(exc).__name__}: {exc})") from exc
                raise ValueError(f"{path} line {number} is cut short or damaged "
                                 f"({type(exc).__name__}: {exc})") from exc
            if header is None:
                if not isinstance(record, dict) or record.get("format") != "workbench.trajectory_batch":
                    raise NotABatchFile(f"{path} is not a workbench trajectory batch file (its first line is "
                                        "not the header TrajectoryBatch.save writes)")
                header = record
            elif not isinstance(record, dict) or "token_ids" not in record:
                raise ValueError(f"{path} line {number} is not an episode record (a JSON object with "
                                 "'token_ids')")
            else:
                records.append(record)
    if header is None:
        raise NotABatchFile(f"{path} is empty: not a workbench trajectory batch file")
    return header, records


def _line_parts(f: Any, limit: int, chunk: int = 1 << 20) -> tuple[list[bytes], int]:
    """The next line of binary file `f` as pieces of at most `chunk` bytes, and its length;
    reading stops once the line is longer than `limit` (so an endless line costs about
    `limit` bytes, never a copy of it). ([], 0) at the end of the file."""
    parts: list[bytes] = []
    size = 0
    while size <= limit:
        piece = f.readline(chunk)
        if not piece:
            break
        parts.append(piece)
        size += len(piece)
        if piece.endswith(b"\n"):
            break
    return parts, size


def open_text(path: Path, mode: str, compresslevel: int = 9) -> Any:
    """A text file, gzip-compressed (at `compresslevel` when written) when its name ends in ".gz"."""
    if path.name.endswith(".gz") or path.name.endswith(".gz.tmp"):
        return gzip.open(path, mode + "t", encoding="utf-8", compresslevel=compresslevel)
    return path.open(mode, encoding="utf-8")
