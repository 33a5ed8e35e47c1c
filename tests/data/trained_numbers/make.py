"""Writes tests/data/trained_numbers/run/: the suite's trained model, a
tiny config (2 layers a side, d_model 64) trained 400 steps on the numbers
task, saved as a model directory (config, vocabulary, the model's weights
as checkpoint ckpt-400, no optimizer state).

The suite's numeric comparisons read these weights (conftest's
`trained_numbers_run`), so that every host compares the same model: a
model trained by the host that runs the suite would differ with the CPU's
kernels (oneDNN and Eigen sum in other orders on AVX2 and AVX-512), and so
would every maximum read from it. Run from the repository's root:

  python tests/data/trained_numbers/make.py
"""

import os
import shutil
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(os.path.dirname(HERE)))  # tests/

# pylint: disable=g-import-not-at-top,wrong-import-position
import keras
import tensorflow as tf

from tf_transformer.run import run_dir
from training_helpers import UNCOMPILED, make_trainer, vocabulary

STEPS = 400


def main():
  out = os.path.join(HERE, "run")
  with tempfile.TemporaryDirectory() as work:
    keras.utils.set_random_seed(1234)
    trainer = make_trainer(work, overrides="dropout_rate=0.0",
                           train_steps=STEPS, batch_tokens=1024,
                           log_every_steps=100, **UNCOMPILED)
    trainer.train()
    shutil.rmtree(out, ignore_errors=True)
    run_dir.save(out, trainer.config)
    vocabulary().save(out)
    tf.train.CheckpointManager(tf.train.Checkpoint(model=trainer.model), out,
                               max_to_keep=1).save(checkpoint_number=STEPS)
  print(f"wrote {out}")


if __name__ == "__main__":
  main()
