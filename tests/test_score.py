"""Scoring given translations (forced decoding): the export's `score`
signature gives the model's own teacher-forced log-probabilities, answers
odd requests, and bin/score.py prints them for an export or a run."""

import numpy as np
import pytest
import sentencepiece as spm
import tensorflow as tf
import tensorflow_text  # noqa: F401  (registers the ops the graph uses)

from tf_transformer.data import numbers
from tf_transformer.run import run_dir
from conftest import run_script
from training_helpers import token_log_probs

# conftest.trained_export's: above the longest source here (18 subwords), so
# that nothing is cut but the long requests.
MAX_INPUT_TOKENS, OFFSET = 24, 10
PAIRS = numbers.generate({"test": 24}, seed=11)["test"]
SOURCES = [s for s, _ in PAIRS]
REFERENCES = [t for _, t in PAIRS]


@pytest.fixture(name="exported", scope="module")
def _exported(trained_export):
  return trained_export


@pytest.fixture(scope="module")
def score(exported):
  loaded = tf.saved_model.load(exported)
  signature = loaded.signatures["score"]

  def call(sources, targets):
    strings = lambda texts: tf.constant(texts, tf.string, shape=[len(texts)])
    return {k: v.numpy() for k, v in signature(
        source=strings(sources), target=strings(targets)).items()}
  call.signature = signature
  return call


def test_equals_the_models_teacher_forced_log_probs(trained_numbers_run,
                                                    score):
  model, vocab = run_dir.load_trained_model(str(trained_numbers_run))
  processor = spm.SentencePieceProcessor(model_proto=vocab.model_proto)
  # The references, and wrong targets (another pair's) the model dislikes.
  targets = REFERENCES + REFERENCES[1:] + REFERENCES[:1]
  sources = SOURCES + SOURCES
  out = score(sources, targets)
  expected = token_log_probs(model, processor, sources, targets)
  for row, want in enumerate(expected):
    length = out["lengths"][row]
    assert length == len(want)  # subwords + EOS
    np.testing.assert_allclose(out["token_log_probs"][row, :length], want,
                               atol=1e-5)
    assert np.all(out["token_log_probs"][row, length:] == 0)
  np.testing.assert_allclose(out["log_prob"],
                             out["token_log_probs"].sum(axis=1), atol=1e-5)
  right, wrong = np.split(out["log_prob"], 2)
  # The trained model knows its task: its references are far likelier than
  # another pair's (by 24.6-31.3 nats on average on 9 numbers models, where
  # the share of pairs so ordered, 23 or 24 of 24, rested on a line or two).
  assert np.mean(right) > np.mean(wrong) + 1.0
  assert np.all(out["log_prob"] < 0)


def test_odd_requests_get_defined_answers(score):
  empty = score([], [])
  assert empty["log_prob"].shape == (0,)
  assert empty["token_log_probs"].shape == (0, 0)
  assert empty["lengths"].shape == (0,)
  out = score(["seven", "", "nine " * 200, "seven", "\xff seven"],
              ["", "sieben", "neun", "neun " * 200, "sieben"])
  assert out["lengths"][0] == 1  # an empty target: the EOS alone
  # A target longer than any output the export gives is cut to it.
  assert out["lengths"][3] == MAX_INPUT_TOKENS + OFFSET + 1
  assert np.all(np.isfinite(out["log_prob"]))
  # The signature's metadata says the token axis varies (TF Serving
  # clients read it).
  shape = score.signature.structured_outputs["token_log_probs"].shape
  assert shape.as_list() == [None, None]
  with pytest.raises(tf.errors.InvalidArgumentError,
                     match="source and target must hold as many strings"):
    score(["seven", "eight"], ["sieben"])
  with pytest.raises(tf.errors.InvalidArgumentError,
                     match=r"Shape of tensor source \[2,1\] is not compatible"):
    score.signature(source=tf.constant([["seven"], ["eight"]]),
                    target=tf.constant(["a", "b"]))


def _score_lines(*args):
  result = run_script("score.py", *args)
  assert result.returncode == 0, result.stderr[-2000:]
  return [line.split("\t") for line in result.stdout.splitlines()]


def test_bin_score_gives_the_same_for_the_export_and_the_run(
    trained_numbers_run, exported, score, tmp_path):
  source, target = tmp_path / "source.txt", tmp_path / "target.txt"
  source.write_text("".join(s + "\n" for s in SOURCES[:6]), encoding="utf-8")
  target.write_text("".join(t + "\n" for t in REFERENCES[:6]),
                    encoding="utf-8")
  files = [f"--source={source}", f"--target={target}"]
  from_export = _score_lines(f"--model={exported}", *files, "--tokens")
  from_run = _score_lines(f"--model={trained_numbers_run}", *files)
  want = score(SOURCES[:6], REFERENCES[:6])
  assert len(from_export) == len(from_run) == 6
  for row, (fields, run_fields) in enumerate(zip(from_export, from_run)):
    assert float(fields[0]) == pytest.approx(want["log_prob"][row], abs=1e-4)
    assert int(fields[1]) == want["lengths"][row]
    values = [float(v) for v in fields[2].split()]
    assert len(values) == int(fields[1])
    assert sum(values) == pytest.approx(float(fields[0]), abs=1e-3)
    assert len(run_fields) == 2
    assert float(run_fields[0]) == pytest.approx(float(fields[0]), abs=1e-4)


def test_bin_score_names_bad_input(exported, tmp_path):
  source, target = tmp_path / "source.txt", tmp_path / "target.txt"
  source.write_text("seven\neight\n", encoding="utf-8")
  target.write_text("sieben\n", encoding="utf-8")
  result = run_script("score.py", f"--model={exported}",
                      f"--source={source}", f"--target={target}")
  assert result.returncode == 2
  assert (f"--source={source} has 2 lines but --target={target} has 1"
          in result.stderr)
  result = run_script("score.py", f"--model={tmp_path}",
                      f"--source={source}", f"--target={source}")
  assert result.returncode == 1
  assert "neither a SavedModel version" in result.stderr
