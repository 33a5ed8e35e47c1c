"""The wall time of one training step on a synthetic batch, without the
input pipeline: what the precision probe (`training/precision.py`), the
main job's sizing for its budget (`run/main_job.py`) and the training
benchmark (`benchmark/training_speed.py`) time. By default the step runs
where `bin/train.py` trains without --distribution: the first GPU
TensorFlow sees, else the CPU."""

import shutil
import tempfile

import numpy as np
import tensorflow as tf

from tf_transformer.data.sources import DataSpec
from tf_transformer.data.synthetic import random_pairs
from tf_transformer.stopwatch import median_seconds
from tf_transformer.training import optimizer as optimizer_lib
from tf_transformer.training import strategy as strategy_lib
from tf_transformer.training import trainer as trainer_lib


def seconds_per_step(config, batch_tokens, length, runs=3, warmup=1,
                     strategy=None, **options):
  """The median time of one optimizer update (section 5: loss, gradients,
  Adam) of `config` on random full-length pairs (`data/synthetic.py`).

  Args:
    config: a TransformerConfig.
    batch_tokens: tokens a side; the batch has batch_tokens // length rows.
    length: tokens a sentence, each side.
    runs, warmup: timed updates, after untimed ones (tracing included).
    strategy: a tf.distribute strategy; None: the one device a run trains
      on by default (`strategy.create_strategy("one_device")`).
    **options: `TrainOptions` fields (mixed_precision, xla_loss, ...).
  Returns:
    (seconds, rows): the median update's wall time and the batch's rows.
  Raises:
    RuntimeError: an update's loss is not finite.
  """
  model_dir = tempfile.mkdtemp(prefix="tf_transformer_step_")
  try:
    trainer = trainer_lib.Trainer(
        config.replace(train_steps=10**9, batch_tokens=batch_tokens), None,
        DataSpec(), trainer_lib.TrainOptions(
            model_dir=model_dir, max_length=length, eval_every_steps=0,
            checkpoint_every_secs=0, log_gradient_norm=False, **options),
        strategy or strategy_lib.create_strategy("one_device"))
    source, target_input, labels = random_pairs(
        config.model.vocab_size, batch_tokens, length)
    update = trainer.steps.fixed_batch_step(
        ((tf.constant(source), tf.constant(target_input)),
         tf.constant(labels)))

    def step():
      if not np.isfinite(update()):
        raise RuntimeError("the training step's loss on a synthetic batch "
                           "is not finite")
    return median_seconds(step, runs, warmup), len(source)
  finally:
    optimizer_lib.set_mixed_precision(None)
    shutil.rmtree(model_dir, ignore_errors=True)
