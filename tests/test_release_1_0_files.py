"""A run directory and a `.keras` file written by release 1.0.0 (made by
its code: tests/data/v1_0/, with what it computed from them) load and
translate the same today, the attention core now
`keras.ops.dot_product_attention` (issue: the attention core that GPUs
fuse)."""

import os

import keras
import numpy as np
import pytest
import sentencepiece as spm

import rounding
from search_reference import lines_apart
from tf_transformer.run import run_dir
from tf_transformer.run.runner import open_translator
from tf_transformer.special_ids import EOS_ID

pytestmark = pytest.mark.numeric

DATA = os.path.join(os.path.dirname(os.path.abspath(__file__)), "data",
                    "v1_0")


def _saved():
  return np.load(os.path.join(DATA, "outputs.npz"))


def test_its_keras_file_and_run_give_its_logits():
  """Logits of release 1.0.0's kernels on another host, and today's: two
  paths, each within its float32 bound (rounding.py) of the exact ones."""
  saved = _saved()
  model = keras.saving.load_model(os.path.join(DATA, "model.keras"))
  run, _ = run_dir.load_trained_model(os.path.join(DATA, "run"))
  source, target = saved["source"], saved["target"]
  positions = [(row, t) for row in range(len(target))
               for t in range(target.shape[1])]
  _, bound = rounding.logit_bounds(
      run, [rounding.unpadded(source)[row] for row, _ in positions],
      [list(target[row, 1:t + 1]) for row, t in positions])
  for loaded in (model, run):
    logits = keras.ops.convert_to_numpy(loaded((source, target)))
    rounding.assert_within(np.stack([logits[r, t] for r, t in positions]),
                           np.stack([saved["logits"][r, t]
                                     for r, t in positions]), 2 * bound)


def test_its_run_translates_as_it_did():
  """The same greedy and beam translations but at near ties of the search
  (tests/search_reference.py: 1.0.0's kernels and today's are two
  implementations), their scores within both paths' float32 bounds
  (rounding.py)."""
  saved = _saved()
  texts = [str(t) for t in saved["texts"]]
  model, vocab = run_dir.load_trained_model(os.path.join(DATA, "run"))
  processor = spm.SentencePieceProcessor(model_proto=vocab.model_proto)
  sources = [ids + [EOS_ID] for ids in processor.encode(texts)]
  decoding_options = model.config.decoding
  for method, decoding in (("greedy", dict(method="greedy")),
                           ("beam", {})):
    found = open_translator(model_dir=os.path.join(DATA, "run"),
                            **decoding).translate(texts)
    got = [h[0][0] for h in found]
    want = [str(t) for t in saved[method]]
    apart = lines_apart(
        model, sources, [[processor.encode(t)] for t in want],
        [[processor.encode(t)] for t in got],
        beam_size=1 if method == "greedy" else decoding_options.beam_size,
        alpha=decoding_options.length_penalty_alpha,
        max_length_offset=decoding_options.max_decode_length_offset)
    same = np.array([line not in apart for line in range(len(texts))])
    bound = 2 * rounding.output_bounds(
        model, sources, [processor.encode(t) + [EOS_ID] for t in want])
    rounding.assert_within(np.array([h[0][1] for h in found])[same],
                           saved[f"{method}_scores"][same], bound[same])
