#!/usr/bin/env python3
r"""Averages the model variables of a run's last N checkpoints (section 6.1:
5 for base, 20 for big) into a new model directory that export and
translate accept. Optimizer slots and the step are not averaged.

  bin/average_checkpoints.py --model_dir=/tmp/run --num_checkpoints=5 \
      --output_dir=/tmp/run/averaged
"""

import sys

from absl import flags

from tf_transformer import command
from tf_transformer.run.runner import Runner
from tf_transformer.training.checkpoints import CheckpointError

FLAGS = flags.FLAGS
flags.DEFINE_string("model_dir", None, "The training run's directory.")
flags.DEFINE_integer("num_checkpoints", 5, "How many of the newest "
                     "checkpoints to average.")
flags.DEFINE_string("output_dir", None, "Where the averaged model goes.")
flags.mark_flags_as_required(["model_dir", "output_dir"])


def main(argv):
  del argv
  try:
    averaged = Runner(FLAGS.model_dir).average(FLAGS.num_checkpoints,
                                               FLAGS.output_dir)
  except (CheckpointError, FileNotFoundError) as e:
    print(f"average_checkpoints: error: {e}", file=sys.stderr)
    return 1
  print(f"averaged {len(averaged.checkpoints)} checkpoints: "
        + ", ".join(p.rsplit("/", 1)[-1] for p in averaged.checkpoints))
  print(f"wrote {averaged.path}")
  return 0


if __name__ == "__main__":
  command.run(main)
