#!/usr/bin/env python3
r"""Checks a run's Transformers export (bin/export.py --format=transformers)
against the run itself on real text: the same sentences decoded by our
searches and by `MarianMTModel.generate()` from `MarianTokenizer`'s ids.

  benchmarks/compare_transformers.py --model_dir=runs/multi30k/averaged \
      --source=runs/multi30k/data/test_2016_flickr.en \
      --reference=runs/multi30k/data/test_2016_flickr.de

Prints, for the first --sentences lines: the largest gap between the two
models' per-token log-probabilities of the references (teacher forced); how
many greedy outputs are identical (token for token, and as text); and the
BLEU of both beam searches (--beam_size, no length penalty: Transformers'
penalty is not section 6.1's) against the references, with the lines whose
beam outputs differ. Needs transformers and torch (the "test" extra).
"""

import os
import sys
import tempfile

from absl import flags
import numpy as np

from tf_transformer import command
from tf_transformer.data.corpora import read_lines
from tf_transformer.data.errors import DataError
from tf_transformer.special_ids import BOS_ID, EOS_ID, PAD_ID

FLAGS = flags.FLAGS
flags.DEFINE_string("model_dir", None, "A training run or an averaged one.")
flags.DEFINE_string("source", None, "Source sentences, one per line.")
flags.DEFINE_string("reference", None, "Their references, one per line.")
flags.DEFINE_integer("sentences", 100, "Lines compared.", lower_bound=1)
flags.DEFINE_integer("beam_size", 4, "The beam of both beam searches.",
                     lower_bound=1)
flags.DEFINE_integer("batch_size", 16, "Sentences per call of our search.",
                     lower_bound=1)
flags.DEFINE_string("export_dir", None, "Where the Transformers directory "
                    "goes (default: a temporary one).")
flags.mark_flags_as_required(["model_dir", "source", "reference"])


def _ours(model, sources, offset, **options):
  """Our search's best output (ids, EOS included) for each source."""
  import tensorflow as tf  # pylint: disable=g-import-not-at-top
  from tf_transformer.decoding import search  # pylint: disable=g-import-not-at-top
  outputs = []
  for start in range(0, len(sources), FLAGS.batch_size):
    part = sources[start:start + FLAGS.batch_size]
    batch = np.zeros([len(part), max(map(len, part))], np.int32)
    for row, source in zip(batch, part):
      row[:len(source)] = source
    ids, _ = search.decode(model, tf.constant(batch), search.DecodingOptions(
        max_decode_length_offset=offset, **options))
    outputs += [[i for i in row if i != PAD_ID] for row in ids.numpy()[:, 0]]
  return outputs


def _theirs(model, sources, offset, **options):
  import torch  # pylint: disable=g-import-not-at-top
  outputs = []
  for source in sources:
    with torch.no_grad():
      out = model.generate(torch.tensor([source]), do_sample=False,
                           max_new_tokens=len(source) + offset,
                           **options)[0].tolist()
    outputs.append([i for i in out[1:] if i != PAD_ID])
  return outputs


def _largest_log_prob_gap(ours, theirs, sources, targets, start):
  import tensorflow as tf  # pylint: disable=g-import-not-at-top
  import torch  # pylint: disable=g-import-not-at-top
  worst = 0.0
  for source, target in zip(sources, targets):
    decoder_input = np.array([[start] + target[:-1]], np.int32)
    labels = np.array(target)
    with torch.no_grad():
      logits = theirs(input_ids=torch.tensor([source]),
                      decoder_input_ids=torch.tensor(decoder_input)).logits
    expected = torch.log_softmax(logits, -1)[0].numpy()
    got = tf.nn.log_softmax(ours((np.array([source], np.int32),
                                  decoder_input)))[0].numpy()
    rows = np.arange(len(labels))
    worst = max(worst, float(np.abs(got[rows, labels] -
                                    expected[rows, labels]).max()))
  return worst


def main(argv):
  del argv
  try:
    texts = read_lines(FLAGS.source)[:FLAGS.sentences]
    references = read_lines(FLAGS.reference)[:len(texts)]
  except DataError as e:
    print(f"compare_transformers: error: {e}", file=sys.stderr)
    return 2
  # pylint: disable=g-import-not-at-top
  import sacrebleu
  import transformers
  from tf_transformer.run import loading
  from tf_transformer.run.runner import Runner
  export_dir = FLAGS.export_dir or os.path.join(
      tempfile.mkdtemp(prefix="compare_transformers_"), "hf")
  Runner(FLAGS.model_dir).export(export_dir, format="transformers")
  tokenizer = transformers.MarianTokenizer.from_pretrained(export_dir)
  theirs = transformers.MarianMTModel.from_pretrained(export_dir).eval()
  model, vocabulary, options = loading.trained(FLAGS.model_dir)
  offset = options.max_decode_length_offset
  sources = [tokenizer(text)["input_ids"] for text in texts]
  ours_sources = [list(vocabulary.tokenize(t).numpy()) + [EOS_ID]
                  for t in texts]
  targets = [tokenizer(text_target=r)["input_ids"] for r in references]
  start = PAD_ID if model.config.model.decoder_start == "zero" else BOS_ID
  text = lambda ids: tokenizer.decode(ids, skip_special_tokens=True)
  print(f"{len(texts)} lines of {FLAGS.source}; the export: {export_dir}")
  print(f"MarianTokenizer's ids equal ours: "
        f"{sum(a == b for a, b in zip(sources, ours_sources))}/{len(texts)}")
  gap = _largest_log_prob_gap(model, theirs, sources, targets, start)
  print(f"per-token log-probabilities of the references: largest gap "
        f"{gap:.2e}")
  greedy = (_ours(model, sources, offset, method="greedy"),
            _theirs(model=theirs, sources=sources, offset=offset,
                    num_beams=1))
  same = sum(a == b for a, b in zip(*greedy))
  same_text = sum(text(a) == text(b) for a, b in zip(*greedy))
  print(f"greedy: identical tokens {same}/{len(texts)}, identical text "
        f"{same_text}/{len(texts)}")
  beam = (_ours(model, sources, offset, beam_size=FLAGS.beam_size,
                length_penalty_alpha=0.0),
          _theirs(model=theirs, sources=sources, offset=offset,
                  num_beams=FLAGS.beam_size, length_penalty=0.0))
  hypotheses = [[text(ids) for ids in outputs] for outputs in beam]
  scores = [sacrebleu.corpus_bleu(h, [references]).score for h in hypotheses]
  print(f"beam {FLAGS.beam_size}, no length penalty: BLEU ours "
        f"{scores[0]:.2f}, Transformers {scores[1]:.2f} "
        f"({scores[1] - scores[0]:+.2f}); identical outputs "
        f"{sum(a == b for a, b in zip(*hypotheses))}/{len(texts)}")
  for i, (a, b) in enumerate(zip(*hypotheses)):
    if a != b:
      print(f"  line {i + 1}: ours {a!r}\n  {'':>{len(str(i + 1)) + 6}}"
            f"Transformers {b!r}")
  return 0


if __name__ == "__main__":
  command.run(main, packages=("tf_transformer.", "bench."))
