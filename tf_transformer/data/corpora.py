"""Parallel corpora as streams of (source, target) text pairs.

Three kinds of source, all yielding Python `str` pairs:
- local text: a source file and a target file, one sentence per line, or one
  TSV file of `source<TAB>target` lines, each gzipped or not;
- any TFDS translation dataset, in either direction;
- `numbers`, the embedded generated task (see `numbers.py`).

Reading is strict where data would otherwise be silently wrong (missing
files, different line counts, invalid UTF-8, an empty corpus: a `DataError`
naming the file and line) and lenient where skipping is the standard
behaviour (pairs with an empty side are skipped and counted in `stats`).
"""

import collections
import dataclasses
import gzip
import os
import sys
import zlib
from typing import Iterator, Optional

from tf_transformer.data.errors import DataError

Pair = tuple  # (source: str, target: str)

GZIP_MAGIC = b"\x1f\x8b"  # RFC 1952's first two bytes


@dataclasses.dataclass
class ReadStats:
  """What reading a corpus kept and skipped."""
  pairs: int = 0
  skipped: collections.Counter = dataclasses.field(
      default_factory=collections.Counter)


def _open_lines(path: str) -> Iterator[tuple]:
  """(line_number, text) for each line of a UTF-8 file, gzipped or not (as
  corpora ship, Multi30k's and WMT's; told by the file's first bytes),
  newline stripped; a byte-order mark opening the file is not part of line
  1."""
  if not os.path.exists(path):
    raise DataError(f"{path}: no such file; check the path")
  if os.path.isdir(path):
    raise DataError(f"{path}: is a directory; give a text file, one "
                    "sentence a line")
  with open(path, "rb") as f:
    gzipped = f.read(2) == GZIP_MAGIC
  number = 0
  try:
    with (gzip.open if gzipped else open)(path, "rb") as f:
      for number, raw in enumerate(f, 1):
        yield number, _decoded(raw, number, path)
  except (EOFError, gzip.BadGzipFile, zlib.error) as e:
    raise DataError(f"{path}:{number + 1}: the gzip data is cut short or "
                    f"damaged ({e}); download or compress the file again"
                    ) from None


def _decoded(raw: bytes, number: int, name: str) -> str:
  """Line `number` of `name` as text, newline stripped; a DataError naming
  both where it is not UTF-8."""
  try:
    line = raw.decode("utf-8-sig" if number == 1 else "utf-8")
  except UnicodeDecodeError as e:
    raise DataError(f"{name}:{number}: invalid UTF-8 ({e.reason} at "
                    f"byte {e.start}); convert the file to UTF-8 (e.g. "
                    "iconv) or remove the line") from None
  return line.rstrip("\r\n")


def read_input(path: Optional[str] = None) -> list:
  """The lines a command translates: those of `path` as `read_lines` reads
  them, or of standard input, as strictly (a `DataError` names "stdin" and
  the line)."""
  if path:
    return read_lines(path)
  return list(_stdin_lines())


def _stdin_lines() -> Iterator[str]:
  """Each line of standard input as it comes, as `read_input` reads it."""
  for number, raw in enumerate(sys.stdin.buffer, 1):
    yield _decoded(raw, number, "stdin")


def line_windows(lines: list, window: int, skip: int = 0) -> list:
  """`lines` in windows that a command translates and writes one after
  another (Marian's maxi-batch, fairseq's buffer), so that output flows
  while the input is long.

  Args:
    lines: the input lines.
    window: lines a window; 0: all in one.
    skip: lines already done (a resumed command's), left out.
  Returns:
    (first line number, lines) of each window.
  """
  size = window or max(len(lines) - skip, 1)
  return [(start + 1, lines[start:start + size])
          for start in range(skip, len(lines), size)]


def stdin_windows(window: int) -> Iterator[tuple]:
  """`line_windows` of standard input, each yielded once its `window`
  lines (or the input's end) have come, so that stdin can be typed at;
  raises a `DataError` naming "stdin" and the line where a line is not
  UTF-8."""
  lines, first = [], 1
  for number, line in enumerate(_stdin_lines(), 1):
    lines.append(line)
    if len(lines) == window:
      yield first, lines
      lines, first = [], number + 1
  if lines:
    yield first, lines


def read_lines(path: str) -> list:
  """Every line of a UTF-8 file, strictly read (a `DataError` names the
  file and line), empty lines kept: line i answers line i of another file."""
  return [line for _, line in _open_lines(path)]


def check_line_aligned(first: list, second: list, names) -> None:
  """Raises a DataError naming both inputs unless they hold as many lines.

  Args:
    first, second: the lines of two inputs that answer each other line by
      line (a source and its references, targets or prefixes).
    names: how the message names the two (a flag and its file).
  """
  if len(first) != len(second):
    raise DataError(f"{names[0]} has {len(first)} lines but {names[1]} has "
                    f"{len(second)}; the files must be line-aligned")


def keep_pair(source: str, target: str, stats: ReadStats) -> bool:
  if not source.strip() or not target.strip():
    stats.skipped["empty side"] += 1
    return False
  stats.pairs += 1
  return True


def read_parallel_files(source_path: str, target_path: str,
                        stats: Optional[ReadStats] = None) -> Iterator[Pair]:
  """Pairs from line-aligned files; pairs with an empty side are skipped."""
  stats = stats if stats is not None else ReadStats()
  source_lines = _open_lines(source_path)
  target_lines = _open_lines(target_path)
  number = 0
  for number, source in source_lines:
    target_line = next(target_lines, None)
    if target_line is None:
      raise DataError(
          f"{target_path} has {number - 1} lines but {source_path} has more "
          f"(line {number} has no translation); the files must be "
          "line-aligned")
    if keep_pair(source, target_line[1], stats):
      yield source, target_line[1]
  extra = next(target_lines, None)
  if extra is not None:
    raise DataError(
        f"{source_path} has {number} lines but {target_path} has more (line "
        f"{extra[0]} has no source); the files must be line-aligned")
  if stats.pairs == 0:
    raise DataError(f"{source_path} / {target_path}: no sentence pairs "
                    f"(skipped: {dict(stats.skipped) or 'none'}); give files "
                    "with at least one line of text on both sides")


def read_tsv(path: str, stats: Optional[ReadStats] = None) -> Iterator[Pair]:
  """Pairs from `source<TAB>target` lines; blank lines are skipped."""
  stats = stats if stats is not None else ReadStats()
  for number, line in _open_lines(path):
    if not line.strip():
      stats.skipped["empty line"] += 1
      continue
    fields = line.split("\t")
    if len(fields) != 2:
      raise DataError(f"{path}:{number}: expected 2 tab-separated fields "
                      f"(source<TAB>target), found {len(fields)}")
    if keep_pair(fields[0], fields[1], stats):
      yield fields[0], fields[1]
  if stats.pairs == 0:
    raise DataError(f"{path}: no sentence pairs "
                    f"(skipped: {dict(stats.skipped) or 'none'}); give a file "
                    "of source<TAB>target lines")


def read_local(source: str, target: Optional[str] = None,
               stats: Optional[ReadStats] = None) -> Iterator[Pair]:
  """Two line-aligned files, or one TSV file when `target` is None."""
  if target:
    return read_parallel_files(source, target, stats)
  return read_tsv(source, stats)
