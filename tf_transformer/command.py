"""How every bin/ command runs: absl's `app.run`, with these fixes for users.

- Flags first. A command's flags are defined by modules that do not import
  TensorFlow (`tf_transformer.choices`), and `run` imports TensorFlow only
  once they are parsed and checked: --help and a bad flag are answered in
  well under a second, not after TensorFlow's 5-second import. Each script
  imports the package's TensorFlow modules inside its `main`.
- A quiet start. Before that import, TensorFlow's C++ log level is raised
  to 3 unless TF_CPP_MIN_LOG_LEVEL is set or absl's --verbosity / -v is
  given: its "failed call to cuInit: CUDA error" on a machine without a GPU
  reads as a failure to a user. The lines TensorFlow prints while it
  loads, before its logging is set up (oneDNN and CUDA notices), ignore
  that level; they are captured and only those at or above it are passed
  on.
- `--help` lists every flag the command reads. absl shows only the main
  module's flags there (the data and decoding flags, defined in shared
  modules, hid behind `--helpfull` among absl's and TensorFlow's own); here
  the flags of every `tf_transformer` module become the command's key flags.
- `--help` (and `--helpfull`, `--helpshort`, `-?`) exit with status 0, as
  asking for help is not an error; absl exits 1. Run as an installed
  `tf-transformer-NAME`, the usage names the installed commands, not the
  clone's `bin/NAME.py`.
- A refused flag or combination of flags answers in two lines, whether
  absl's parser or the command refused it: `COMMAND: error: ...` and where
  to read the flags (absl prints the whole --help before an `app.UsageError`).
- A reader that leaves (`translate.py ... | head`) ends a command quietly
  (`write_stdout`), as it ends a Unix tool, not with a Broken pipe error.
- A full disk ends any command in one line with status 75
  (`disk_full.py`): the path, what was kept, what to do.
"""

import contextlib
import os
import re
import signal
import sys
import tempfile
import traceback

from absl import app
from absl import flags

from tf_transformer import disk_full

HELP_FLAGS = ("help", "helpshort", "helpfull", "helpxml", "?")
# A C++ log line: severity letter I, W, E or F, then the date (MMDD).
_LOG_LINE = re.compile(r"^([IWEF])\d{4} ")
_EARLY_BANNER = "WARNING: All log messages before absl::InitializeLog()"
_KEPT = []  # what `run` was told a full disk keeps, for `fail`


def _verbose(args):
  return any(re.match(r"--?(v|verbosity)(=|$)", arg) for arg in args)


def import_tensorflow_quietly():
  """Imports TensorFlow, passing on only the start-up lines at or above
  TF_CPP_MIN_LOG_LEVEL (default 3 here unless --verbosity / -v); for a
  command that `run` without it and needs it only on some paths."""
  if "TF_CPP_MIN_LOG_LEVEL" not in os.environ and not _verbose(sys.argv[1:]):
    os.environ["TF_CPP_MIN_LOG_LEVEL"] = "3"
  level = int(os.environ.get("TF_CPP_MIN_LOG_LEVEL") or 0)
  with _stderr_filtered(level) if level > 0 else contextlib.nullcontext():
    import tensorflow  # pylint: disable=g-import-not-at-top,unused-import


@contextlib.contextmanager
def _stderr_filtered(level):
  """Captures file descriptor 2 (C++ writes there, not to sys.stderr) while
  the block runs, then writes back `_at_least(level)` of it."""
  sys.stderr.flush()
  try:
    saved = os.dup(2)
  except OSError:  # no stderr to protect
    yield
    return
  with tempfile.TemporaryFile() as captured:
    os.dup2(captured.fileno(), 2)
    try:
      yield
    finally:
      os.dup2(saved, 2)
      os.close(saved)
      captured.seek(0)
      sys.stderr.write(_at_least(captured.read().decode("utf-8", "replace"),
                                 level))
      sys.stderr.flush()


def _at_least(text, level):
  """The lines of `text` whose C++ log severity is at least `level` (a
  message's unprefixed continuation lines go with it), and the lines before
  the first log line; never absl's banner about early messages."""
  kept, keep = [], True
  for line in text.splitlines(keepends=True):
    match = _LOG_LINE.match(line)
    if match:
      keep = "IWEF".index(match.group(1)) >= level
    elif line.startswith(_EARLY_BANNER):
      keep = False
      continue
    if keep:
      kept.append(line)
  return "".join(kept)


def usage(doc, program):
  """A command's docstring as its --help shows it to `program`
  (sys.argv[0]): run as an installed `tf-transformer-NAME`, each
  `bin/NAME.py` it names is written as that command."""
  if not os.path.basename(program or "").startswith("tf-transformer-"):
    return doc
  return re.sub(r"\bbin/(\w+)\.py\b", lambda m: "tf-transformer-" +
                m.group(1).replace("_", "-"), doc or "")


def run(main, tensorflow=True, packages=("tf_transformer.",), kept=None):
  """`app.run(main)` with the package's flags in --help, which exits 0.

  Args:
    main: the command's main(argv), which imports the package's TensorFlow
      modules itself; its module's docstring is the command's usage.
    tensorflow: import TensorFlow (quietly) once the flags are parsed and
      checked, before `main`; False for a command that may not need it.
    packages: the prefixes of the modules whose flags --help lists.
    kept: called after a full disk stopped `main` (here or in `fail`):
      (what was kept, as a sentence or None; the path the command writes,
      or None), for the line `disk_full.message` says.
  """
  _KEPT[:] = [kept] if kept else []
  # absl prints __main__'s docstring as the usage: a console script's or a
  # bin/ door's __main__ is not the command's module.
  sys.modules["__main__"].__doc__ = usage(
      sys.modules[main.__module__].__doc__, sys.argv[0])
  for module, defined in flags.FLAGS.flags_by_module_dict().items():
    if module.startswith(packages):
      for flag in defined:  # key flags of the main module: what --help shows
        flags.FLAGS.register_key_flag_for_module(sys.argv[0], flag)
  started = []
  name = main.__module__.rsplit(".", 1)[-1]

  def main_started(argv):
    started.append(True)
    try:
      if tensorflow:
        import_tensorflow_quietly()
      return main(argv)
    except app.UsageError as e:
      return refuse(name, str(e))
    except Exception as e:  # pylint: disable=broad-except
      if not disk_full.is_disk_full(e):
        raise
      return fail(name, e)

  def parse(argv):
    try:
      return flags.FLAGS(argv)
    except flags.Error as e:
      if _asked_for_help(argv[1:]):
        raise
      sys.exit(refuse(name, str(e)))

  try:
    app.run(main_started, flags_parser=parse)
  except SystemExit as e:
    if not started and e.code == 1 and _asked_for_help(sys.argv[1:]):
      sys.exit(0)
    raise


def refuse(name, message):
  """Says that the command `name` refuses its flags, in two lines on stderr;
  returns its exit status, 1."""
  sys.stderr.write(f"{name}: error: {message}\n"
                   f"Pass --help to see the flags of {name}.\n")
  return 1


def fail(name, error, status=1, kept=None):
  """Says on stderr that the command `name` failed with `error`, in one
  line; returns its exit status: `disk_full.EXIT_STATUS` where the disk is
  full (`kept()`, default the one given to `run`, then says what is kept),
  else `status`."""
  kept = kept or (_KEPT[0] if _KEPT else None)
  if not disk_full.is_disk_full(error):
    print(f"{name}: error: {error}", file=sys.stderr)
    return status
  if _verbose(sys.argv[1:]):
    traceback.print_exception(error)
  print(disk_full.message(name, error, *(kept() if kept else (None, None))),
        file=sys.stderr, flush=True)
  return disk_full.EXIT_STATUS


def write_stdout(text):
  """Writes `text` on stdout and flushes it, so that a reader sees each
  part as it comes.

  Raises:
    SystemExit: with the shell's status for SIGPIPE (141), and nothing
      printed, where the reader has closed the pipe (`| head`), as a Unix
      tool ends; stdout then points at /dev/null, so that the
      interpreter's last flush does not complain either.
  """
  try:
    sys.stdout.write(text)
    sys.stdout.flush()
  except BrokenPipeError:
    os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
    raise SystemExit(128 + signal.SIGPIPE) from None


def complete_lines(path):
  """The number of whole lines in file `path` (0 where there is none), its
  last line cut where a stopped writer left it without its line break: what
  a resumed command keeps of its --output."""
  if not os.path.exists(path):
    return 0
  count, last = 0, b"\n"
  with open(path, "rb") as f:
    for chunk in iter(lambda: f.read(1 << 20), b""):
      count += chunk.count(b"\n")
      last = chunk[-1:]
  if last != b"\n":
    with open(path, "rb+") as f:
      f.seek(0)
      kept = 0
      for _ in range(count):
        kept += len(f.readline())
      f.truncate(kept)
  return count


class Output:
  """A command's --output file, or stdout (`path` None), written a part at
  a time, each part flushed; the file is opened at the first write (a
  command refused before its first output leaves no file) and made, empty,
  where nothing was written. With `append`, the parts go after what the
  file holds."""

  def __init__(self, path, append=False):
    self.path, self.file, self.append = path, None, append

  def __enter__(self):
    return self

  def write(self, lines):
    """Writes `lines`, each with a line break."""
    text = "".join(line + "\n" for line in lines)
    if not self.path:
      write_stdout(text)
      return
    if self.file is None:
      self.file = open(self.path, "a" if self.append else "w",
                       encoding="utf-8")
    self.file.write(text)
    self.file.flush()

  def __exit__(self, kind, *exc):
    if self.path and self.file is None and kind is None:
      self.write([])
    if self.file is not None:
      self.file.close()


def exit_now(status):
  """Ends the process with `status` at once, after flushing its output:
  for a run stopped by a signal, whose checkpoint, summaries and files are
  written. The interpreter's own teardown would free TensorFlow's input
  pipelines first, which waits for the element each is preparing (2 to 26
  s measured after a SIGTERM or Ctrl-C, by what was in flight)."""
  from absl import logging  # pylint: disable=g-import-not-at-top
  logging.flush()
  sys.stdout.flush()
  sys.stderr.flush()
  os._exit(status)  # pylint: disable=protected-access


def _asked_for_help(args):
  return any(arg.lstrip("-").split("=")[0] in HELP_FLAGS for arg in args
             if arg.startswith("-"))


def megabytes(path) -> float:
  """The size of the files under `path` (or of the file `path`), in MB
  (10^6 bytes): what a command that writes a model reports."""
  if os.path.isfile(path):
    return os.path.getsize(path) / 1e6
  return sum(os.path.getsize(os.path.join(root, name))
             for root, _, names in os.walk(path) for name in names) / 1e6
