"""Every command (bin/, the installed `tf-transformer-*`, and the measuring
tools of benchmarks/) parses and checks its flags before TensorFlow loads
(`tf_transformer.command`): --help and a bad flag are answered without
TensorFlow's 5-second import, a user's typo costs a fraction of a second,
and a refused flag answers in two lines, as an unknown one does."""

import os
import subprocess
import sys

import pytest

from conftest import REPO

DOORS = sorted(name for name in os.listdir(os.path.join(REPO, "bin"))
               if name.endswith(".py"))
TOOLS = sorted(f"benchmarks/{name}" for name in os.listdir(
    os.path.join(REPO, "benchmarks")) if name.endswith(".py"))
COMMANDS = DOORS + TOOLS

# Runs a bin/ script as its own __main__ and says, on its last line of
# stdout, how it exited and whether TensorFlow (or Keras, which imports it
# on its default backend) was imported.
PROBE = """
import os, runpy, sys
sys.argv = sys.argv[1:]
sys.path.insert(0, os.path.dirname(sys.argv[0]))  # as `python SCRIPT` does
status = 0
try:
  runpy.run_path(sys.argv[0], run_name="__main__")
except SystemExit as e:
  status = e.code
loaded = sorted({"tensorflow", "keras"} & set(sys.modules))
print(f"\\nstatus={status} loaded={','.join(loaded) or 'none'}")
"""


def _probe(script, *args, stdin=b""):
  """(exit status, 'none' or the heavy modules loaded, stdout, stderr)."""
  path = script if "/" in script else os.path.join("bin", script)
  result = subprocess.run(
      [sys.executable, "-c", PROBE, os.path.join(REPO, path), *args],
      capture_output=True, input=stdin, timeout=120, cwd=REPO)
  out, err = (s.decode("utf-8", "replace") for s in (result.stdout,
                                                      result.stderr))
  last = out.splitlines()[-1]
  status, loaded = (part.split("=", 1)[1] for part in last.split())
  return int(status), loaded, out, err


def _assert_refused(script, args, message, expected_status=1, stdin=b""):
  """`script args` exits with `expected_status`, `message` in its stderr,
  no traceback, and neither TensorFlow nor Keras imported. A refused flag
  (status 1) says so in the two lines of an unknown flag."""
  status, loaded, _, err = _probe(script, *args, stdin=stdin)
  assert status == expected_status, err[-2000:]
  assert message in err, err[-2000:]
  assert loaded == "none", f"{script} {args} imported {loaded}"
  assert "Traceback" not in err
  if expected_status == 1:
    name = os.path.basename(script)[:-len(".py")]
    assert err.splitlines() == [
        err.splitlines()[0], f"Pass --help to see the flags of {name}."], err
    assert err.startswith(f"{name}: error: "), err


def test_every_command_is_probed():
  assert len(DOORS) >= 13 and "translate.py" in DOORS
  assert "benchmarks/benchmark.py" in TOOLS


def test_each_installed_command_has_a_door_in_bin():
  """setup.py installs `tf-transformer-NAME` for each module NAME of
  tf_transformer/cli (its `run`); bin/NAME.py runs the same from a clone,
  and --help names the command's own usage, not the door's."""
  cli = sorted(name for name in os.listdir(os.path.join(REPO, "tf_transformer",
                                                        "cli"))
               if name.endswith(".py") and name != "__init__.py")
  assert cli == DOORS
  with open(os.path.join(REPO, "setup.py"), encoding="utf-8") as f:
    assert ('f"tf-transformer-{name.replace(\'_\', \'-\')}='
            'tf_transformer.cli.{name}:run"') in f.read()
  # The entry point as pip's console script calls it.
  code = ("import sys; sys.argv[0] = 'tf-transformer-translate'; "
          "from tf_transformer.cli.translate import run; run()")
  result = subprocess.run([sys.executable, "-c", code, "--help"],
                          capture_output=True, text=True, timeout=60)
  assert result.returncode == 0, result.stderr[-2000:]
  assert result.stdout.startswith("Translates sentences"), result.stdout[:200]
  assert "\n  --model:" in result.stdout
  # Its examples name the installed commands, not the clone's doors.
  assert "| tf-transformer-translate --model=" in result.stdout
  assert "bin/" not in result.stdout.split("flags:")[0]


@pytest.mark.parametrize("script", COMMANDS)
def test_help_lists_the_flags_without_tensorflow(script):
  status, loaded, out, err = _probe(script, "--help")
  assert status == 0, err[-2000:]
  assert loaded == "none", f"{script} --help imported {loaded}"
  assert "\n  --" in out, out[-2000:]  # at least one flag with its help


@pytest.mark.parametrize("script,args,message", [
    ("translate.py", ["--beam_size=0"], "--beam_size"),
    ("translate.py", ["--decoding=sample", "--temperature=0"],
     "--temperature=0.0: must be > 0"),
    ("translate.py", ["--top_k=-1"], "--top_k"),
    ("translate.py", ["--top_p=0"], "--top_p=0.0: must be in (0, 1]"),
    ("translate.py", ["--min_length=-1"], "--min_length"),
    ("export.py", ["--model_dir=/nonexistent/run", "--export_dir=/n/e",
                   "--no_repeat_ngram_size=1"],
     "--no_repeat_ngram_size=1: must be 0 (off) or >= 2"),
    ("export.py", ["--model_dir=/nonexistent/run", "--export_dir=/n/e",
                   "--num_samples=0"], "--num_samples"),
    ("translate.py", ["--alignment_layer=2"], "--alignment_layer is read "
     "only with --alignment"),
    ("evaluate.py", ["--source=a.txt"], "--reference"),
    ("score.py", ["--model=m", "--source=a", "--target=b",
                  "--alignment_layer=2"], "--alignment_layer is read only "
     "with --alignment"),
    ("serving_client.py", ["--model_name=m", "--alignment",
                           "--signature=nbest"],
     "--alignment: one translation a line"),
    ("serving_client.py", ["--model_name=m", "--target=t",
                           "--signature=nbest"],
     "--target scores given translations"),
    ("serving_client.py", ["--model_name=m", "--tokens"],
     "--tokens is read only with --target"),
    ("train.py", ["--model_dir=/nonexistent/run", "--keep_checkpoints=2",
                  "--average_checkpoints=5"],
     "train: error: --keep_checkpoints=2 is below --average_checkpoints=5"),
    ("prepare_data.py", ["--output_dir=/nonexistent/out",
                         "--write_text=train,valid"], "--write_text"),
    ("main_job.py", ["--task=wmt"], "--task"),
    ("export.py", ["--model_dir=/nonexistent/run", "--dtype=float16"],
     "--dtype"),
    ("export.py", ["--model_dir=/nonexistent/run", "--export_dir=/n/e",
                   "--alignment_layer=1"], "--alignment_layer: only with "
     "--format=ctranslate2"),
    ("plot_attention.py", ["--sentence=a", "--output_dir=/nonexistent/out",
                           "--kind=cross"], "--kind"),
])
def test_a_bad_flag_is_refused_before_tensorflow_loads(script, args,
                                                        message):
  _assert_refused(script, args, message)


@pytest.mark.parametrize("script,args,status,message", [
    ("evaluate.py", ["--model=/nonexistent/1", "--source={two}",
                     "--reference={one}"], 2,
     "evaluate: error: --source={two} has 2 lines but --reference={one} has "
     "1; the files must be line-aligned"),
    ("score.py", ["--model=/nonexistent/1", "--source={one}",
                  "--target={two}"], 2,
     "score: error: --source={one} has 1 lines but --target={two} has 2"),
    ("serving_client.py", ["--protocol=grpc", "--model_name=m",
                           "--input={two}", "--target={one}"], 2,
     "serving_client: error: --input={two} has 2 lines but --target={one} "
     "has 1"),
    ("translate.py", ["--model=/nonexistent/1", "--input={two}",
                      "--target_prefix={one}"], 2,
     "translate: error: --target_prefix={one} has 1 lines but {two} has 2"),
    ("translate.py", ["--model=/nonexistent/1", "--model_dir=/n/run",
                      "--input={one}"], 1,
     "pass exactly one of --model and --model_dir"),
    ("evaluate.py", ["--model=/nonexistent/1", "--beam_size=2",
                     "--source={one}", "--reference={one}"], 1,
     "--beam_size: the decoding is fixed in an export"),
    ("translate.py", ["--model=/nonexistent/1", "--input={latin1}"], 2,
     "translate: error: {latin1}:2: invalid UTF-8"),
    ("translate.py", ["--model=/nonexistent/1", "--input={missing}"], 2,
     "translate: error: {missing}: no such file"),
    ("serving_client.py", ["--model_name=m", "--input={latin1}"], 2,
     "serving_client: error: {latin1}:2: invalid UTF-8"),
])
def test_inputs_that_need_no_model_are_refused_before_tensorflow_loads(
    tmp_path, script, args, status, message):
  """Line counts that differ (exit 2, bad input files), and the choice of
  model (exit 1, bad flags), are told before TensorFlow loads (and before
  any model is read: the paths do not exist)."""
  files = {"one": tmp_path / "one.txt", "two": tmp_path / "two.txt",
           "latin1": tmp_path / "latin1.txt", "missing": tmp_path / "no.txt"}
  files["one"].write_text("a\n")
  files["two"].write_text("a\nb\n")
  files["latin1"].write_bytes("a\nstraße\n".encode("latin-1"))
  _assert_refused(script, [arg.format(**files) for arg in args],
                  message.format(**files), status)


@pytest.mark.parametrize("script,args", [
    ("translate.py", ["--model=/nonexistent/1"]),
    ("serving_client.py", ["--model_name=m"])])
def test_input_from_stdin_is_read_as_strictly_as_a_file(script, args):
  """A line of standard input that is not UTF-8 is named by its number,
  before TensorFlow loads or any server is asked."""
  _assert_refused(script, args, "error: stdin:2: invalid UTF-8", 2,
                  stdin="a\nstraße\n".encode("latin-1"))


def test_a_reader_that_leaves_ends_a_command_quietly():
  """`translate.py ... | head`: once the reader has closed the pipe, the
  next write ends the command with the shell's SIGPIPE status (141), as it
  ends a Unix tool, and nothing on stderr (no Broken pipe error)."""
  code = ("import sys\n"
          "from tf_transformer.command import write_stdout\n"
          "write_stdout('first\\n')\n"
          "sys.stdin.readline()\n"
          "write_stdout('second\\n')\n"
          "print('not reached', file=sys.stderr)\n")
  writer = subprocess.Popen([sys.executable, "-c", code], cwd=REPO,
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
  assert writer.stdout.readline() == "first\n"
  writer.stdout.close()  # the reader leaves, then the writer writes again
  _, stderr = writer.communicate("go\n", timeout=60)
  assert writer.returncode == 141, stderr
  assert stderr == ""
