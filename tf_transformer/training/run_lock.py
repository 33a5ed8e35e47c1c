"""One training run per model directory.

Two runs writing the same `--model_dir` would silently overwrite each other's
checkpoints. `RunLock` holds an exclusive `flock` on MODEL_DIR/train.lock for
the life of the run, and writes the holder's pid, host and start time into it
so that a second run can say who holds it. The kernel drops the lock when its
process dies however it dies, so a lock left by a killed run is stale by
construction: the next run takes it over and says so. A run that ends
normally empties the file. (On NFS, flock is
emulated with fcntl locks; a directory that is not a local path, such as
gs://..., cannot be locked, which is logged.)
"""

import fcntl
import json
import os
import socket
import time

from absl import logging

FILENAME = "train.lock"


class RunLockedError(RuntimeError):
  """Another live process trains in this model directory."""


class RunLock:
  """`with RunLock(model_dir):` -- refuses when another run holds it."""

  def __init__(self, model_dir: str, ignore: bool = False):
    self.path = os.path.join(model_dir, FILENAME)
    self.ignore = ignore
    self._file = None

  def __enter__(self):
    if "://" in self.path:
      logging.warning("%s is not a local path and cannot be locked: make "
                      "sure no other run trains in it", self.path)
      return self
    os.makedirs(os.path.dirname(self.path), exist_ok=True)
    self._file = open(self.path, "a+", encoding="utf-8")
    try:
      fcntl.flock(self._file, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
      holder = self._holder()
      self._file.close()
      self._file = None
      if not self.ignore:
        raise RunLockedError(
            f"{os.path.dirname(self.path)} is in use by another training run "
            f"({holder}); wait for it to end or stop it, use another "
            "--model_dir, or pass --ignore_run_lock if you are sure it "
            "writes elsewhere") from None
      logging.warning("--ignore_run_lock: training although %s holds %s",
                      holder, self.path)
      return self
    previous = self._holder()
    if previous != "no holder recorded":
      logging.info("%s was left by a run that no longer holds it (%s); "
                   "taking it over", self.path, previous)
    self._file.seek(0)
    self._file.truncate()
    json.dump({"pid": os.getpid(), "host": socket.gethostname(),
               "started": time.strftime("%Y-%m-%d %H:%M:%S %Z")}, self._file)
    self._file.flush()
    return self

  def _holder(self) -> str:
    self._file.seek(0)
    try:
      holder = json.loads(self._file.read())
      return (f"pid {holder['pid']} on host {holder['host']}, started "
              f"{holder['started']}")
    except (ValueError, KeyError, TypeError):
      return "no holder recorded"

  def __exit__(self, *exc_info):
    if self._file is not None:
      # The file stays (removing it would let a run that opened it just
      # before lock a deleted inode while a third locks a new file); empty
      # means released cleanly.
      self._file.truncate(0)
      self._file.flush()
      fcntl.flock(self._file, fcntl.LOCK_UN)
      self._file.close()
      self._file = None
    return False
