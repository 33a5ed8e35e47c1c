r"""Averages the model variables of a run's last N checkpoints (section 6.1:
5 for base, 20 for big) into a new model directory that export and
translate accept. Optimizer slots and the step are not averaged.

  bin/average_checkpoints.py --model_dir=/tmp/run --num_checkpoints=5 \
      --output_dir=/tmp/run/averaged

With --last_step=best (or a step), the last N saved at or before the best
dev evaluation's step: for a run that went on training past its best.
"""


from absl import flags

from tf_transformer import command

FLAGS = flags.FLAGS
flags.DEFINE_string("model_dir", None, "The training run's directory.")
flags.DEFINE_integer("num_checkpoints", 5, "How many of the newest "
                     "checkpoints to average.")
flags.DEFINE_string("output_dir", None, "Where the averaged model goes.")
flags.DEFINE_string("last_step", None, "Average the newest checkpoints saved "
                    "at or before this step (as fairseq's "
                    "--checkpoint-upper-bound); 'best': the step of the "
                    "run's best dev evaluation (MODEL_DIR/best/).")
flags.mark_flags_as_required(["model_dir", "output_dir"])


def last_step(value):
  """--last_step as given: None, a step (int) or "best"; ValueError else."""
  if value is None or value == "best":
    return value
  try:
    return int(value)
  except ValueError:
    raise ValueError(f"--last_step={value}: expected a step (an integer) "
                     "or 'best'") from None


def main(argv):
  del argv
  try:  # before TensorFlow's import
    bound = last_step(FLAGS.last_step)
  except ValueError as e:
    return command.fail("average_checkpoints", e, 1)
  command.import_tensorflow_quietly()
  # pylint: disable=g-import-not-at-top  (TensorFlow after the flags)
  from tf_transformer.run.runner import Runner
  from tf_transformer.training.checkpoints import CheckpointError
  try:
    averaged = Runner(FLAGS.model_dir).average(
        FLAGS.num_checkpoints, FLAGS.output_dir, last_step=bound)
  except (CheckpointError, FileNotFoundError) as e:
    return command.fail("average_checkpoints", e, 1)
  print(f"averaged {len(averaged.checkpoints)} checkpoints: "
        + ", ".join(p.rsplit("/", 1)[-1] for p in averaged.checkpoints))
  print(f"wrote {averaged.path}")
  return 0


def _kept():
  """What a full disk left: (--output_dir as it was, --output_dir)."""
  return (f"{FLAGS.output_dir} is as it was; the partial average is removed",
          FLAGS.output_dir)


def run():
  """`tf-transformer-average-checkpoints`: parses the flags, then runs `main`."""
  command.run(main, tensorflow=False, kept=_kept)
