"""Folders written whole or not at all: written beside their place, then
renamed into it.

A CTranslate2 export, an averaged run and an imported run are written into
`PATH.writing` and renamed to `PATH`; a folder already at `PATH` is first
renamed to `PATH.replaced` and removed once the new one is in. A kill at any
moment leaves `PATH` as it was or complete and new (between the two renames,
the old folder waits in `PATH.replaced` and the next write puts it back).
The next write removes what a stopped one left, and logs one line saying so.
(SavedModel versions are written the same way by `serving/export.py`, under
names TF Serving ignores.)
"""

import contextlib
import os
import shutil

from absl import logging

WRITING, REPLACED = ".writing", ".replaced"


def clean_up(path):
  """Puts back or removes what a write of `path` stopped midway left:
  `PATH.replaced` goes back to `PATH` where `PATH` is missing (the kill
  fell between the two renames), and `PATH.writing` is removed. Returns the
  lines logged."""
  path = path.rstrip("/")
  said = []
  if os.path.isdir(path + REPLACED):
    if os.path.exists(path):
      shutil.rmtree(path + REPLACED)
    else:
      os.rename(path + REPLACED, path)
      said.append(f"put back {path}, which a stopped write had moved aside")
  if os.path.exists(path + WRITING):
    shutil.rmtree(path + WRITING)
    said.append(f"removed {path + WRITING}, left by a write that was stopped")
  for line in said:
    logging.warning("%s", line)
  return said


@contextlib.contextmanager
def written(path, carry=None):
  """Yields the folder to write `path`'s new contents into; when the block
  ends, that folder replaces `path`, with copies of the files of the old
  `path` whose names `carry(name)` accepts and the new one lacks. Where the
  block raises (a full disk, a bad input), the folder is removed and `path`
  is as it was."""
  path = path.rstrip("/")
  clean_up(path)
  os.makedirs(path + WRITING)
  try:
    yield path + WRITING
    if carry and os.path.isdir(path):
      _carry(path, path + WRITING, carry)
  except BaseException:
    shutil.rmtree(path + WRITING, ignore_errors=True)
    raise
  if os.path.exists(path):
    os.rename(path, path + REPLACED)
  os.rename(path + WRITING, path)
  shutil.rmtree(path + REPLACED, ignore_errors=True)


def _carry(old, new, carry):
  for name in sorted(set(os.listdir(old)) - set(os.listdir(new))):
    if carry(name):
      source, target = os.path.join(old, name), os.path.join(new, name)
      if os.path.isdir(source):
        shutil.copytree(source, target)
      else:
        shutil.copy2(source, target)
