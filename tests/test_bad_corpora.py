"""Bad corpora on every path a file takes (vocabulary, train, dev, test):
the user gets the reader's one sentence naming the file and line, never
tf.data's wrapped traceback or SentencePiece's error with a --vocab_size
hint; the scripts print it as one line and exit with status 2, with nothing
of TensorFlow's start-up around it."""

import gzip
import os
import re
import subprocess
import sys

import pytest

from tf_transformer.data import corpora
from tf_transformer.data import prepare
from tf_transformer.data.errors import DataError
from tf_transformer.data.sources import DataSpec
from conftest import REPO, run_script

GOOD_SOURCE = "".join(f"good sentence {i}\n" for i in range(40))
GOOD_TARGET = "".join(f"guter Satz {i}\n" for i in range(40))

# name -> (source content, target content, what the message must say);
# None as content: the path does not exist; "dir": the path is a directory.
CASES = {
    "target_shorter": (GOOD_SOURCE, "x\ny\n", r"has 2 lines but .*\.src has "
                       r"more \(line 3 has no translation\)"),
    "source_shorter": ("a\n", GOOD_TARGET, r"\.src has 1 lines but .*\.tgt "
                       r"has more \(line 2 has no source\)"),
    "invalid_utf8": (GOOD_SOURCE.encode() + b"caf\xe9\n", GOOD_TARGET + "x\n",
                     r"\.src:41: invalid UTF-8"),
    "both_empty": ("", "", "no sentence pairs"),
    "source_empty": ("", GOOD_TARGET, r"\.src has 0 lines but .*\.tgt has "
                     r"more \(line 1 has no source\)"),
    "missing": (None, GOOD_TARGET, r"\.src: no such file"),
    "directory": ("dir", GOOD_TARGET, r"\.src: is a directory"),
}


def _files(directory, name, source, target):
  paths = []
  for side, content in (("src", source), ("tgt", target)):
    path = directory / f"{name}.{side}"
    if content == "dir":
      path.mkdir()
    elif isinstance(content, bytes):
      path.write_bytes(content)
    elif content is not None:
      path.write_text(content, encoding="utf-8")
    paths.append(str(path))
  return paths


def _spec(tmp_path, split, case):
  good = _files(tmp_path, "good", GOOD_SOURCE, GOOD_TARGET)
  bad = _files(tmp_path, case, *CASES[case][:2])
  files = {s: (bad if s == split else good) for s in ("train", "dev", "test")}
  return DataSpec(dataset="", **{f"{s}_{side}": files[s][i]
                                 for s in files
                                 for i, side in enumerate(("source",
                                                           "target"))})


@pytest.mark.parametrize("split", ["train", "dev", "test"])
@pytest.mark.parametrize("case", sorted(CASES))
def test_every_bad_file_on_every_path_raises_the_readers_error(
    tmp_path, split, case):
  spec = _spec(tmp_path, split, case)
  with pytest.raises(DataError, match=CASES[case][2]) as error:
    vocabulary = prepare.build_vocabulary(spec, 300)  # reads train
    prepare.corpus_statistics(spec, vocabulary, 64)  # tf.data, every split
  message = str(error.value)
  assert "Traceback" not in message and "--vocab_size" not in message
  assert "\n" not in message


def test_a_byte_order_mark_is_not_part_of_sentence_one(tmp_path):
  source, target = _files(tmp_path, "bom", "\ufeffone\ntwo\n", "eins\nzwei\n")
  assert list(corpora.read_local(source, target)) == [("one", "eins"),
                                                       ("two", "zwei")]


@pytest.mark.parametrize("script, split", [
    ("prepare_data.py", "train"),  # the SentencePiece trainer reads it
    ("prepare_data.py", "dev"),    # tf.data reads it (statistics)
    ("train.py", "train"),
    ("train.py", "dev"),
])
def test_scripts_print_one_line_and_exit_2(tmp_path, script, split):
  spec = _spec(tmp_path, split, "target_shorter")
  files = [f"--{s}_{side}={getattr(spec, f'{s}_{side}')}"
           for s in ("train", "dev") for side in ("source", "target")]
  output = ["--output_dir" if script == "prepare_data.py" else "--model_dir",
            str(tmp_path / "out")]
  result = run_script(script, "--dataset=", *files, "--vocab_size=300",
                      "=".join(output), "--config=tiny"
                      if script == "train.py" else "--max_length=64")
  assert result.returncode == 2, result.stderr[-3000:]
  name = script.replace(".py", "")
  ours = [line for line in result.stderr.splitlines()
          if line.startswith(f"{name}: ")]
  assert len(ours) == 1, result.stderr[-3000:]
  assert ours[0].startswith(f"{name}: error: {tmp_path}/target_shorter.tgt "
                            "has 2 lines but")
  assert ours[0].endswith("the files must be line-aligned")
  for noise in ("Traceback", "InvalidArgumentError", "--vocab_size", "At:"):
    assert noise not in result.stderr


@pytest.mark.slow
def test_commands_start_quiet_unless_asked(tmp_path):
  """Without TF_CPP_MIN_LOG_LEVEL, a command's stderr is its own line only:
  no 'CUDA error' on a machine without a GPU, no oneDNN notice; absl's -v
  (or the variable) brings TensorFlow's start-up lines back."""
  spec = _spec(tmp_path, "train", "target_shorter")
  args = [os.path.join(REPO, "bin", "prepare_data.py"), "--dataset=",
          f"--train_source={spec.train_source}",
          f"--train_target={spec.train_target}", f"--output_dir={tmp_path}"]
  env = {k: v for k, v in os.environ.items() if k != "TF_CPP_MIN_LOG_LEVEL"}
  quiet = subprocess.run([sys.executable, *args], capture_output=True,
                         text=True, env=env, timeout=300)
  assert quiet.returncode == 2
  assert quiet.stderr.splitlines() == [
      line for line in quiet.stderr.splitlines()
      if line.startswith("prepare_data: error: ")]
  assert len(quiet.stderr.splitlines()) == 1
  verbose = subprocess.run([sys.executable, *args, "-v=0"],
                           capture_output=True, text=True, env=env,
                           timeout=300)
  assert "oneDNN custom operations are on" in verbose.stderr


def test_start_up_lines_are_filtered_by_severity():
  from tf_transformer.command import _at_least  # pylint: disable=g-import-not-at-top
  text = ("a line of Python's own\n"
          "WARNING: All log messages before absl::InitializeLog() is called "
          "are written to STDERR\n"
          "I0000 00:00:17.9 1 port.cc:153] oneDNN custom operations\n"
          "I0000 00:00:17.9 1 cpu_feature_guard.cc:227] This binary\n"
          "To enable the following instructions: AVX2\n"
          "E0000 00:00:17.9 1 cuda_platform.cc:52] failed call to cuInit\n"
          "  its continuation\n")
  assert _at_least(text, 3) == "a line of Python's own\n"
  assert _at_least(text, 2) == (
      "a line of Python's own\n"
      "E0000 00:00:17.9 1 cuda_platform.cc:52] failed call to cuInit\n"
      "  its continuation\n")
  assert _at_least(text, 0) == text.replace(text.splitlines(True)[1], "")


def test_gzipped_files_read_as_plain_ones_and_a_cut_one_is_named(tmp_path):
  """Corpora ship gzipped (Multi30k's raw files, WMT's): every reader takes
  them as they are, told by their first bytes, whatever their name."""
  plain = [tmp_path / "plain.src", tmp_path / "plain.tgt"]
  zipped = [tmp_path / "zipped.src.gz", tmp_path / "zipped.tgt"]
  for path, text in zip(plain, (GOOD_SOURCE, GOOD_TARGET)):
    path.write_text(text, encoding="utf-8")
  for path, text in zip(zipped, (GOOD_SOURCE, GOOD_TARGET)):
    path.write_bytes(gzip.compress(text.encode()))
  assert corpora.read_lines(str(zipped[1])) == GOOD_TARGET.splitlines()
  assert list(corpora.read_local(*map(str, zipped))) == list(
      corpora.read_local(*map(str, plain)))
  cut = tmp_path / "cut.gz"
  cut.write_bytes(gzip.compress(GOOD_SOURCE.encode())[:-12])
  with pytest.raises(DataError, match=r"cut\.gz:\d+: the gzip data is cut "
                     r"short or damaged"):
    corpora.read_lines(str(cut))


@pytest.mark.slow
@pytest.mark.parametrize("script", ["compare_exports.py",
                                    "server_batching.py"])
def test_benchmark_tools_name_a_bad_source_in_one_line(tmp_path, script):
  """The benchmark tools that read --source start quiet and answer a file
  they cannot read (here gzip data cut short) with the reader's line and
  status 2, before any export is loaded."""
  export = tmp_path / "export"
  export.mkdir()
  (export / "saved_model.pb").write_bytes(b"")  # never loaded
  source = tmp_path / "source.gz"
  source.write_bytes(gzip.compress(GOOD_SOURCE.encode())[:-12])
  model = (f"--exports=a={export}" if script == "compare_exports.py"
           else f"--model={export}")
  env = {k: v for k, v in os.environ.items() if k != "TF_CPP_MIN_LOG_LEVEL"}
  result = subprocess.run(
      [sys.executable, os.path.join(REPO, "benchmarks", script), model,
       f"--source={source}"], capture_output=True, text=True, env=env,
      timeout=300)
  assert result.returncode == 2, result.stderr[-3000:]
  name = script.replace(".py", "")
  lines = result.stderr.splitlines()
  assert len(lines) == 1, result.stderr
  assert re.fullmatch(
      rf"{name}: error: {re.escape(str(source))}:\d+: the gzip data is cut "
      r"short or damaged \(.+\); download or compress the file again",
      lines[0]), lines[0]
