"""A full disk: one line (the path, "no space", what was kept), exit status
75, no traceback; the same command goes on once space is freed. Through a
real small filesystem (a tmpfs) where this process may mount one (as root),
else through an injected ENOSPC; and folders written whole (whole_dir)."""

import contextlib
import errno
import os
import shutil
import subprocess
import sys
import uuid

import pytest
import tensorflow as tf

from conftest import REPO, run_script
from test_train_script import TINY
from training_helpers import MECHANICS_FLAGS
from tf_transformer import command
from tf_transformer import disk_full
from tf_transformer import whole_dir

# Slow (README.md's quick tier leaves it out): commands run against a full
# disk, end to end.
pytestmark = pytest.mark.slow


@contextlib.contextmanager
def small_disk(path, megabytes):
  """A tmpfs of `megabytes` mounted at `path` while the block runs; yields
  False (and mounts nothing) where this process may not mount one."""
  path.mkdir()
  mounted = os.geteuid() == 0 and subprocess.run(
      ["mount", "-t", "tmpfs", "-o", f"size={megabytes}m", "tmpfs",
       str(path)], capture_output=True).returncode == 0
  try:
    yield mounted
  finally:
    if mounted:
      subprocess.run(["umount", "-l", str(path)], check=True)


def fill(path, leave_bytes):
  """Fills the filesystem of `path` but `leave_bytes`; returns the file."""
  filler = path / f"filler-{uuid.uuid4().hex}"
  stat = os.statvfs(path)
  with open(filler, "wb") as f:
    f.write(b"\0" * max(0, stat.f_bavail * stat.f_frsize - leave_bytes))
  return filler


# Without a tmpfs: the command runs with its checkpoint (or SavedModel)
# write failing as TensorFlow reports a full disk.
INJECT = r"""
import runpy, sys
import tensorflow as tf
def full(*args, **kwargs):
  raise tf.errors.ResourceExhaustedError(
      None, None, "{path}/part-0.tempstate1; No space left on device")
{target} = full
sys.argv = sys.argv[1:]
runpy.run_path(sys.argv[0], run_name="__main__")
"""


def _injected(script, path, target, *args):
  code = INJECT.replace("{path}", str(path)).replace("{target}", target)
  return subprocess.run(
      [sys.executable, "-c", code, os.path.join(REPO, "bin", script), *args],
      capture_output=True, text=True, timeout=600, cwd=REPO,
      env=dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2"))


def _says_disk_full(result, command_name, path, kept):
  assert result.returncode == disk_full.EXIT_STATUS, result.stderr[-3000:]
  assert "Traceback" not in result.stderr
  last = result.stderr.strip().splitlines()[-1]
  assert last.startswith(f"{command_name}: error: no space left on device "
                         f"writing {path}"), last
  assert kept in last and "free space" in last, last


def test_training_on_a_full_disk_says_so_and_resumes(tmp_path):
  disk = tmp_path / "disk"
  with small_disk(disk, 24) as mounted:
    model_dir = disk / "run"
    args = [*MECHANICS_FLAGS, "--checkpoint_every_steps=2",
            "--eval_every_steps=0"]
    first = run_script("train.py", f"--model_dir={model_dir}", *TINY, *args,
                       "--train_steps=2")
    assert first.returncode == 0, first.stderr[-3000:]
    if mounted:
      # Room for less than one more checkpoint.
      size = sum(f.stat().st_size for f in model_dir.glob("ckpt-2.*"))
      filler = fill(disk, size // 2)
      full = run_script("train.py", f"--model_dir={model_dir}", *TINY,
                        *args, "--train_steps=4")
      filler.unlink()
    else:
      full = _injected("train.py", model_dir / "ckpt-4_temp",
                       "tf.train.CheckpointManager.save",
                       f"--model_dir={model_dir}", *TINY, *args,
                       "--train_steps=4")
    _says_disk_full(full, "train", model_dir / "ckpt-4_temp",
                    f"the last good checkpoint is {model_dir}/ckpt-2, which "
                    "the same command resumes from")
    assert tf.train.latest_checkpoint(str(model_dir)).endswith("ckpt-2")
    again = run_script("train.py", f"--model_dir={model_dir}", *TINY, *args,
                       "--train_steps=4")
    assert again.returncode == 0, again.stderr[-3000:]
    assert f"resumed from {model_dir}/ckpt-2 at step 2" in again.stderr
    assert tf.train.latest_checkpoint(str(model_dir)).endswith("ckpt-4")
    assert not list(model_dir.glob("*_temp"))


def test_an_export_to_a_full_disk_keeps_the_versions_before(
    tmp_path, untrained_export):
  model_dir, version = untrained_export
  disk = tmp_path / "disk"
  with small_disk(disk, 2 * sum(
      f.stat().st_size for f in version.rglob("*") if f.is_file()) // 2**20
                  + 4) as mounted:
    export_dir = disk / "numbers"
    shutil.copytree(version, export_dir / "1")
    flags = (f"--model_dir={model_dir}", f"--export_dir={export_dir}")
    if mounted:
      filler = fill(disk, 2**19)
      full = run_script("export.py", *flags)
      filler.unlink()
    else:
      full = _injected("export.py", export_dir / ".writing-2",
                       "tf.saved_model.save", *flags)
    _says_disk_full(full, "export", export_dir / ".writing-2",
                    f"the newest version, {export_dir}/1, is as it was")
    assert sorted(os.listdir(export_dir)) == ["1"]


def test_disk_full_errors_are_told_from_others():
  enospc = OSError(errno.ENOSPC, "No space left on device", "/data/x.npy")
  tf_full = tf.errors.ResourceExhaustedError(
      None, None, "/run/ckpt-9_temp/part-0; No space left on device "
      "[Op:SaveV2]")
  assert disk_full.is_disk_full(enospc)
  assert disk_full.path_of(enospc) == "/data/x.npy"
  assert disk_full.is_disk_full(tf_full)
  assert disk_full.path_of(tf_full) == "/run/ckpt-9_temp/part-0"
  assert disk_full.is_disk_full(OSError(errno.EDQUOT, "Disk quota exceeded"))
  try:  # raised while handling the full disk: still a full disk
    try:
      raise enospc
    except OSError as e:
      raise ValueError("could not write the table") from e
  except ValueError as chained:
    assert disk_full.is_disk_full(chained)
  assert not disk_full.is_disk_full(FileNotFoundError(errno.ENOENT, "no"))
  assert not disk_full.is_disk_full(tf.errors.ResourceExhaustedError(
      None, None, "OOM when allocating tensor"))


def test_fail_says_one_line_and_chooses_the_status(capsys):
  assert command.fail("score", ValueError("--beam_size=0: must be >= 1"),
                      2) == 2
  assert capsys.readouterr().err == (
      "score: error: --beam_size=0: must be >= 1\n")
  status = command.fail(
      "translate", OSError(errno.ENOSPC, "No space left", "/out/t.txt"), 1,
      kept=lambda: ("/out/t.txt holds the lines written before", None))
  assert status == disk_full.EXIT_STATUS
  assert capsys.readouterr().err == (
      "translate: error: no space left on device writing /out/t.txt; "
      "/out/t.txt holds the lines written before; free space on that disk "
      "and rerun the same command\n")


def test_a_folder_is_replaced_whole_or_left_as_it_was(tmp_path):
  path = tmp_path / "averaged"
  path.mkdir()
  (path / "ckpt-1.index").write_text("old")
  (path / "export.txt").write_text("the user's")
  with pytest.raises(OSError):
    with whole_dir.written(str(path)) as writing:
      (tmp_path / "averaged.writing" / "ckpt-2.index").write_text("new")
      raise OSError(errno.ENOSPC, "No space left on device")
  assert sorted(os.listdir(tmp_path)) == ["averaged"]
  assert sorted(os.listdir(path)) == ["ckpt-1.index", "export.txt"]

  with whole_dir.written(str(path), carry=lambda name: not name.startswith(
      "ckpt-")) as writing:
    assert writing == str(path) + whole_dir.WRITING
    (tmp_path / "averaged.writing" / "ckpt-2.index").write_text("new")
  assert sorted(os.listdir(tmp_path)) == ["averaged"]
  assert sorted(os.listdir(path)) == ["ckpt-2.index", "export.txt"]


def test_what_a_killed_write_left_is_put_back_or_removed(tmp_path):
  path = tmp_path / "model"
  # Killed between its two renames: the old folder waits aside.
  (tmp_path / "model.replaced").mkdir()
  (tmp_path / "model.replaced" / "model.bin").write_text("old")
  (tmp_path / "model.writing").mkdir()
  said = whole_dir.clean_up(str(path))
  assert said == [f"put back {path}, which a stopped write had moved aside",
                  f"removed {path}.writing, left by a write that was "
                  "stopped"]
  assert sorted(os.listdir(tmp_path)) == ["model"]
  assert (path / "model.bin").read_text() == "old"
  assert whole_dir.clean_up(str(path)) == []


@pytest.mark.parametrize("script,flags", [
    ("translate.py", ["--input={source}"]),
    ("score.py", ["--source={source}", "--target={source}"]),
])
def test_output_to_a_full_device_is_one_line(tmp_path, untrained_export,
                                            script, flags):
  # /dev/full answers every write with ENOSPC, as a full disk does.
  _, version = untrained_export
  source = tmp_path / "source.txt"
  source.write_text("seven\ntwelve\n")
  result = run_script(script, f"--model={version}",
                      *[f.format(source=source) for f in flags],
                      "--output=/dev/full")
  _says_disk_full(result, script[:-3], "/dev/full",
                  "/dev/full holds the lines written before")


def test_a_table_killed_while_written_is_replaced_and_said(tmp_path, caplog):
  # pylint: disable=g-import-not-at-top
  import numpy as np
  from tf_transformer.data import shortlist_table
  (tmp_path / "shortlist.npz.tmp").write_bytes(b"half a table")
  table = shortlist_table.Table(np.zeros([5, 2], np.int32),
                                np.arange(3, dtype=np.int32), "sha", 7)
  with caplog.at_level("WARNING"):
    path = shortlist_table.save(table, str(tmp_path))
  assert f"replacing {path}.tmp, left by a write that was stopped" in (
      caplog.text)
  assert sorted(os.listdir(tmp_path)) == ["shortlist.npz"]
  with np.load(path) as saved:
    assert int(saved["pairs"]) == 7
