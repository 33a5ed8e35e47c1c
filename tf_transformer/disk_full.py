"""A full disk, told in one line.

Every command that writes ends the same way when the disk fills (or a quota
runs out): exit status `EXIT_STATUS` and one line on stderr that names the
path it was writing, says that the disk is full, what was kept, and what to
do; no traceback unless absl's `-v` / `--verbosity` asks for one. The writes
themselves are whole or absent (a checkpoint's index, a SavedModel version,
a CTranslate2 directory, a table are written beside their place and renamed
into it), so freeing space and rerunning the same command is always safe.

Python reports a full disk as `OSError` with errno ENOSPC (or EDQUOT);
TensorFlow's file system as an `OpError` (`ResourceExhaustedError` from
SaveV2, `UnknownError` from others) whose message holds the system's text.
"""

import errno
import re

# EX_TEMPFAIL of sysexits.h: a temporary failure; the user is invited to
# retry (here: once space is freed).
EXIT_STATUS = 75

_ERRNOS = (errno.ENOSPC, errno.EDQUOT)
_TEXTS = ("No space left on device", "Disk quota exceeded")
# TensorFlow's messages put the path before the system's text:
# "...: /run/ckpt-200_temp/part-00000...tempstate123; No space left on device"
_TF_PATH = re.compile(r"(/[^\s;:,'\"]+)[^/]*?(?:No space left|Disk quota)")


def _chain(error):
  """`error` and the exceptions it was raised from or during."""
  seen = []
  while error is not None and error not in seen:
    seen.append(error)
    error = error.__cause__ or error.__context__
  return seen


def is_disk_full(error: BaseException) -> bool:
  """Whether `error` (or one it came from) says the disk or quota is full."""
  for e in _chain(error):
    if isinstance(e, OSError) and e.errno in _ERRNOS:
      return True
    if any(text in str(e) for text in _TEXTS):
      return True
  return False


def path_of(error: BaseException):
  """The path whose write failed, where the error names one, else None."""
  for e in _chain(error):
    if isinstance(e, OSError) and e.filename:
      return str(e.filename)
    match = _TF_PATH.search(str(e))
    if match:
      return match.group(1)
  return None


def message(name, error, kept=None, target=None):
  """The one line a command prints for a full disk.

  Args:
    name: the command ("train").
    error: the exception that said the disk is full.
    kept: what is still there and good (a sentence), or None.
    target: the path the command writes (a flag's value), said where the
      error names no path.
  Returns:
    `NAME: error: no space left on device writing PATH; KEPT; free space
    on that disk and rerun the same command`.
  """
  path = path_of(error) or target or "its output"
  return (f"{name}: error: no space left on device writing {path}; "
          f"{kept or 'what was written before is as it was'}; free space on "
          "that disk and rerun the same command")
