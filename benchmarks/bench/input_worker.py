"""Times the training input pipeline in a process of its own, for
benchmarks/benchmark.py --sections=input:

  python -m bench.input_worker PREPARED_DIR BATCH_TOKENS \
      MAX_LENGTH start|middle BATCHES

opens the token arrays bin/prepare_data.py left in PREPARED_DIR, starts the
stream at batch 0 of epoch 0 (`start`) or half-way through it (`middle`, a
resume), and prints JSON: seconds to the first batch (and of that, the
epoch's plan), real (non-pad) source + target tokens/s over BATCHES
batches, and RssAnon before opening the arrays and after the batches.
"""

import json
import sys
import time

import tensorflow as tf

from bench.input_speed import rss_anon_mib
from tf_transformer.data import token_store
from tf_transformer.data.epoch_batches import EpochBatches
from tf_transformer.data.sources import DataSpec
from tf_transformer.data.vocabulary import Vocabulary


def main(directory, batch_tokens, max_length, where, num_batches):
  before = rss_anon_mib()
  start = time.time()
  with open(f"{directory}/train.tokens.json") as f:
    spec = DataSpec(**json.load(f)["data"])  # what they were made from
  store = token_store.open_store(directory, "train", spec,
                                 Vocabulary.load(directory))  # one corpus
  batches = EpochBatches(store, batch_tokens, max_length)
  plan_start = time.time()
  batches.plan(0)
  plan_seconds = time.time() - plan_start
  start_batch = 0 if where == "start" else batches.per_pipeline // 2
  iterator = iter(batches.dataset(0, start_batch))
  next(iterator)
  first = time.time() - start
  tokens, timed = 0, time.time()
  for _ in range(num_batches):
    ((source, _), target_out), _ = next(iterator)
    tokens += int(tf.math.count_nonzero(source)) + int(
        tf.math.count_nonzero(target_out))
  seconds = time.time() - timed
  print(json.dumps({
      "where": where, "start_batch": start_batch,
      "batches_per_epoch": batches.per_pipeline,
      "seconds_to_first": first, "plan_seconds": plan_seconds,
      "batches": num_batches, "real_tokens_per_sec": tokens / seconds,
      "rss_anon_before_mib": before, "rss_anon_after_mib": rss_anon_mib()}))


if __name__ == "__main__":
  main(sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4],
       int(sys.argv[5]))
