r"""Trains a Transformer (section 5) on one device, all GPUs of a machine, or
several machines.

  bin/train.py --config=tiny --dataset=numbers --model_dir=/tmp/numbers \
      --train_steps=200 --distribution=mirrored --cpu_devices=8

The run's config, data spec, flags and vocabulary are written into
--model_dir; the same command resumes a killed run from its last checkpoint.
SIGTERM or Ctrl-C saves a checkpoint at the next step boundary and exits.

Exit status: 0 trained; 1 bad flags or hparams; 2 bad data (one line naming
the file and line); 3 NaN or Inf, or a loss that ran away (--divergence_factor;
names the last good checkpoint); 4 another run holds --model_dir; 75 the disk
is full (one line: the path and the last good checkpoint; free space and rerun
the same command to resume); 143 / 130 stopped by SIGTERM / SIGINT, checkpoint
saved (the same command resumes).
"""

import signal
import sys

from absl import flags

from tf_transformer import command
from tf_transformer.data import data_flags
from tf_transformer.data.errors import DataError
from tf_transformer.run import train_flags
from tf_transformer.training import interruption
from tf_transformer.training import run_lock

FLAGS = flags.FLAGS
train_flags.define_flags()


def main(argv):
  del argv
  stop = interruption.StopRequest().install()
  for error in train_flags.flag_errors():
    return command.refuse("train", error)
  command.import_tensorflow_quietly()  # after the flags are checked
  # pylint: disable=g-import-not-at-top
  from tf_transformer.run.runner import Runner
  from tf_transformer.run.runner import describe_training
  from tf_transformer.training import strategy as strategy_lib
  from tf_transformer.training import trainer as trainer_lib
  strategy_lib.split_cpu(FLAGS.cpu_devices)  # before any op
  try:
    config = train_flags.config_from_flags()
    spec = data_flags.spec_from_flags()
    # Before anything runs an op: collective ops are configured at start-up.
    strategy = strategy_lib.create_strategy(
        FLAGS.distribution, FLAGS.num_gpus, FLAGS.cpu_devices)
    stop.install()  # again: MultiWorker's coordination agent took SIGTERM
    result = Runner(FLAGS.model_dir).train(
        config, spec, strategy, stop, **train_flags.train_arguments())
  except DataError as e:
    return command.fail("train", e, 2)
  except (ValueError, FileNotFoundError) as e:
    return command.fail("train", e, 1)
  except trainer_lib.DivergedError as e:  # NaN, Inf or a runaway loss
    return _fail(str(e), 3)
  except run_lock.RunLockedError as e:
    return command.fail("train", e, 4)
  except KeyboardInterrupt:
    return _fail("stopped at once by a second Ctrl-C, unsaved; the same "
                 "command resumes from the last checkpoint", 130)
  print("\n".join(describe_training(result, FLAGS.train_minutes)))
  if result["stopped_by"]:  # by our signal or another worker's
    command.exit_now(stop.exit_status or 128 + signal.SIGTERM)  # all saved
  return 0


def _fail(message, status):
  print(f"train: {message}", file=sys.stderr)
  return status


def _kept():
  """What a full disk left of the run: (its last complete checkpoint, the
  run directory)."""
  import tensorflow as tf  # pylint: disable=g-import-not-at-top
  latest = tf.train.latest_checkpoint(FLAGS.model_dir)
  return (f"the last good checkpoint is {latest}, which the same command "
          "resumes from" if latest else "no checkpoint was complete yet",
          FLAGS.model_dir)


def run():
  """`tf-transformer-train`: parses the flags, then runs `main`."""
  command.run(main, tensorflow=False, kept=_kept)
