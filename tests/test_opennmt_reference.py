"""The OpenNMT-tf reference (tests/data/opennmt/, made by its
make_reference.py under OpenNMT-tf 2.32.0 and TensorFlow 2.13.1) reads with
TensorFlow 2.21 alone, and agrees with itself: the checkpoints hold the
variables its model options imply, and each pair's token log-probabilities
add up to its score. The OpenNMT-tf import is measured against it."""

import json
import os

import numpy as np
import pytest

import rounding
import tensorflow as tf

pytestmark = pytest.mark.numeric

DATA = os.path.join(os.path.dirname(os.path.abspath(__file__)), "data",
                    "opennmt")
VALUE = "/.ATTRIBUTES/VARIABLE_VALUE"


def _shapes(directory):
  reader = tf.train.load_checkpoint(directory)
  return {name[:-len(VALUE)]: shape for name, shape in
          reader.get_variable_to_shape_map().items()
          if name.startswith("model/") and name.endswith(VALUE)}


@pytest.mark.parametrize("name", ["shared", "three"])
def test_the_reference_reads_with_tensorflow_alone(name):
  reference = json.load(open(os.path.join(DATA, name, "reference.json")))
  options = reference["model"]
  with open(os.path.join(DATA, "corpus", "onmt.vocab"),
            encoding="utf-8") as f:
    vocabulary = f.read().splitlines()
  assert vocabulary[:3] == ["<blank>", "<s>", "</s>"]
  rows = len(vocabulary) + 1  # OpenNMT-tf's out-of-vocabulary row, last
  d_model, d_ff = options["num_units"], options["ffn_inner_dim"]
  for directory in (os.path.join(DATA, name), os.path.join(DATA, name, "avg")):
    shapes = _shapes(directory)
    embeddings = {k: v for k, v in shapes.items() if k.endswith("/embedding")}
    assert len(embeddings) == (1 if options["share_embeddings"] == "ALL"
                               else 2)
    assert all(v == [rows, d_model] for v in embeddings.values())
    assert shapes["model/decoder/output_layer/bias"] == [rows]
    assert ("model/decoder/output_layer/kernel" in shapes) == (
        options["share_embeddings"] != "ALL")
    for stack in ("encoder", "decoder"):
      assert shapes[f"model/{stack}/layer_norm/gamma"] == [d_model]
      layers = {k.split("/")[3] for k in shapes
                if k.startswith(f"model/{stack}/layers/")}
      assert layers == {str(i) for i in range(options["num_layers"])}
      assert shapes[f"model/{stack}/layers/0/ffn/layer/inner/kernel"] == [
          d_model, d_ff]
  for pair in reference["scores"]:
    # the target's pieces, then </s>
    assert len(pair["token_log_probs"]) == len(pair["target_pieces"]) + 1
    # OpenNMT-tf's float32 sum of its float32 values, and this float64 one:
    # within (n - 1) u of their magnitudes' sum each (rounding.sum_bound).
    assert np.sum(pair["token_log_probs"]) == pytest.approx(
        pair["log_prob"], abs=rounding.sum_bound(pair["token_log_probs"]))
    assert all(p <= 0 for p in pair["token_log_probs"])
  with open(os.path.join(DATA, "corpus", "test.src.pieces"),
            encoding="utf-8") as f:
    assert len(reference["greedy"]) == len(f.read().splitlines()) == len(
        reference["scores"])
