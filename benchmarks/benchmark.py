#!/usr/bin/env python3
r"""Measures training and decoding speed on this machine; prints a table
and writes the figures, the machine, the versions and the flags as JSON.

  # serving a trained model on real text, beside CTranslate2 (the figures
  # docs/performance.md leads with; docs/recipes.md trains the model):
  benchmarks/benchmark.py --sections=serving --model_dir=runs/multi30k/averaged \
      --source=runs/multi30k/data/test_2016_flickr.en \
      --reference=runs/multi30k/data/test_2016_flickr.de
  benchmarks/benchmark.py --config=base --output=benchmark.json
  # the synthetic decoding micro-benchmark of docs/performance.md:
  benchmarks/benchmark.py --config=base \
      --hparams=num_layers=3,d_model=256,d_ff=1024,num_heads=4 \
      --vocab_size=8000 --sections=decode --decode_sentences=1000
  # the training data path at WMT 2014 En-De's size (docs/data.md):
  benchmarks/benchmark.py --sections=input --input_pairs=4500000

Sections (--sections):
- train: seconds per step and source+target tokens/s at --batch_tokens and
  --source_length, for the default (the loss under XLA), the loss without
  XLA, bfloat16 mixed precision, one device and MirroredStrategy over
  --cpu_devices; model FLOPs utilisation against a 4096^3 fp32 matmul timed
  here (model FLOPs: bin/model_summary.py's count, times 3).
- scaling: training tokens/s at source lengths 16, 64, 256.
- serving: the run --model_dir exported as bin/export.py does (default and
  --xla, each with oneDNN on and off; and --decode_parts=--threads served
  with one intra-op thread) and as CTranslate2 (float32, and int8
  quantized at load), each in a fresh process on the first
  --serving_sentences lines of --source: sentences/s and output tokens/s at
  --serving_batch_size in file order and sorted by length, latency (p50,
  p90) one sentence at a time, beam search and greedy; the ratio of each to
  CTranslate2 float32, BLEU against --reference, and the lines identical to
  the default SavedModel's. Not run by default: it needs a trained model.
- litert_step: the decoding step alone on --model_dir's weights and the
  memory of --source's first lines, at --litert_step_rows rows (4: one
  sentence at beam 4; 128: a batch of 32), one thread: TensorFlow's step as
  the SavedModel runs it (float32 and bfloat16) against the same step
  converted to LiteRT with float32 and with int8 weights (`pip install
  ai-edge-litert`), CPU ms a step over a loop of --litert_steps steps, each
  engine's ratio to TensorFlow float32's, and the rows whose ids agree.
  Not run by default: it needs a trained model.
- decode (a synthetic micro-benchmark: random weights, outputs forced to
  --decode_words + 1 tokens): a SavedModel exported like bin/export.py, beam 4 and greedy, at
  batch 1 and --decode_batch_size: sentences/s and output tokens/s; time per
  output token at steps 10, 50, 100; sentences/s for beams 1, 4, 8.
- shortlist (a synthetic micro-benchmark: random weights and a random
  table): beam 4 at --decode_batch_size over the whole vocabulary and over
  a --serving_shortlist=K,N shortlist, timed in alternation, for each of
  --shortlist_vocab_sizes (a --config model, base by default): how the
  gain grows with the vocabulary. Not run by default.
- input: the training data path on a corpus of --input_pairs pairs built
  from Multi30k's captions (two a line: WMT's lengths): bin/prepare_data.py's
  time and tokenization pairs/s a thread, bin/train.py's start to step 1,
  the pipeline's first batch from the start and from mid-epoch (a resume),
  its real tokens/s, and anonymous memory (RssAnon) of each, each in a
  process of its own. Not run by default: it writes the corpus (1.2 GB at
  4.5M pairs) to --input_dir.
Warm-up runs are excluded; each figure is the median of --runs runs.
"""

import sys
import types

from absl import flags
from absl import logging

from tf_transformer import command
from bench import benchmark_flags

FLAGS = flags.FLAGS
benchmark_flags.define_flags()


def main(argv):
  del argv
  logging.set_verbosity(logging.WARNING)  # the figures, not TF's chatter
  from bench import report  # pylint: disable=g-import-not-at-top
  values = types.SimpleNamespace(**FLAGS.flag_values_dict(),
                                 flags_text=FLAGS.flags_into_string())
  try:
    report.run(values)
  except ValueError as e:
    print(f"benchmark: error: {e}", file=sys.stderr)
    return 1
  return 0


if __name__ == "__main__":
  command.run(main, packages=("tf_transformer.", "bench."))
