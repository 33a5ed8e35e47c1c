"""A run directory and a `.keras` file written by release 1.0.0 (made by
its code: tests/data/v1_0/, with what it computed from them) load and
translate the same today, the attention core now
`keras.ops.dot_product_attention` (issue: the attention core that GPUs
fuse)."""

import os

import keras
import numpy as np

from float32_bounds import log_prob_bound
from float32_bounds import sentence
from tf_transformer.run import run_dir
from tf_transformer.run.runner import open_translator

DATA = os.path.join(os.path.dirname(os.path.abspath(__file__)), "data",
                    "v1_0")


def _saved():
  return np.load(os.path.join(DATA, "outputs.npz"))


def test_its_keras_file_and_run_give_its_logits():
  """Logits of release 1.0.0's kernels on another host: within the
  suite's bound relative to their magnitude (tests/float32_bounds.py)."""
  saved = _saved()
  bound = log_prob_bound(saved["logits"])
  model = keras.saving.load_model(os.path.join(DATA, "model.keras"))
  run, _ = run_dir.load_trained_model(os.path.join(DATA, "run"))
  for loaded in (model, run):
    logits = keras.ops.convert_to_numpy(
        loaded((saved["source"], saved["target"])))
    assert np.abs(logits - saved["logits"]).max() <= bound


def test_its_run_translates_as_it_did():
  """The same greedy and beam translations, their scores within the
  per-token bound times the longest output's 32 tokens (--max_length)."""
  saved = _saved()
  texts = [str(t) for t in saved["texts"]]
  for method, decoding in (("greedy", dict(method="greedy")),
                           ("beam", {})):
    found = open_translator(model_dir=os.path.join(DATA, "run"),
                            **decoding).translate(texts)
    assert [h[0][0] for h in found] == [str(t) for t in saved[method]]
    np.testing.assert_allclose([h[0][1] for h in found],
                               saved[f"{method}_scores"], atol=sentence(32))
