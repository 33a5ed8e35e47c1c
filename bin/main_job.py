#!/usr/bin/env python3
r"""The main job, end to end with the repository's own commands: build the
vocabulary, train, average the last checkpoints, export a SavedModel for TF
Serving, score dev and test through it, and translate examples through it
next to their references.

  bin/main_job.py                        # the embedded numbers task, ~4 min
  bin/main_job.py --task=multi30k --data_dir=../shared/data/multi30k
                                         # real captions, ~25 min on 2 cores

--task=numbers (the default) trains the `tiny` preset for 1,000 steps on the
generated English-German number task. --task=multi30k reads the Multi30k
English-German captions from --data_dir (train, val and test_2016_flickr,
`.en`/`.de`, gzipped or not; never copied anywhere but --work_dir) and
trains the `small_corpus` preset for --train_minutes (20), then reports
sacrebleu BLEU and chrF on test_2016_flickr.

The stages run in this process (`tf_transformer/run/main_job.py`, through
the `Runner`); each is announced with the bin/ command that does it alone,
so any stage can be rerun by hand, and the job ends with a summary. Run it
again and the finished training is reused (a killed one resumes from its
last checkpoint); each run exports the next version of --export_dir.
"""

import sys

from absl import flags

from tf_transformer import command
from tf_transformer.data.errors import DataError
from tf_transformer.run import main_job
from tf_transformer.run.main_job import TASKS
from tf_transformer.training import interruption
from tf_transformer.training import run_lock
from tf_transformer.training.checkpoints import CheckpointError
from tf_transformer.training.trainer import NonFiniteLossError

FLAGS = flags.FLAGS
flags.DEFINE_enum("task", "numbers", sorted(TASKS), "numbers: the embedded "
                  "generated task; multi30k: the Multi30k captions in "
                  "--data_dir.")
flags.DEFINE_string("data_dir", None, "--task=multi30k: the folder with "
                    "train, val and test_2016_flickr .en/.de files "
                    "(gzipped or not).")
flags.DEFINE_string("work_dir", None, "Run directory, averaged model and "
                    "the dev/test text files (default: runs/TASK).")
flags.DEFINE_string("export_dir", None, "Where the SavedModel versions go "
                    "(default: saved_models/TASK).")
flags.DEFINE_string("config", None, "Model preset (default: the task's, "
                    "tiny or small_corpus).")
flags.DEFINE_string("hparams", "", "Config overrides.")
flags.DEFINE_integer("train_steps", None, "Optimizer updates (default: the "
                     "task's; numbers 1000).")
flags.DEFINE_float("train_minutes", None, "Training time budget (default: "
                   "the task's; multi30k 20).")
flags.DEFINE_integer("vocab_size", None, "Shared vocabulary size (default: "
                     "the task's; numbers 1000, multi30k 8000).")
flags.DEFINE_integer("average_checkpoints", 5, "Checkpoints averaged.")
flags.DEFINE_integer("num_examples", 8, "Test sentences shown at the end.")
flags.DEFINE_integer("seed", 0, "Seed of data, initialization and order.")
flags.DEFINE_integer("numbers_train_size", None, "Training pairs (default: "
                     "the task's 40,000); fewer for a quick try.")


def main(argv):
  del argv
  stop = interruption.StopRequest().install()
  announce = lambda stage, line: print(f"\n== {stage}: {line}", flush=True)
  try:
    result = main_job.run_job(
        FLAGS.task, FLAGS.work_dir, FLAGS.export_dir, FLAGS.data_dir,
        FLAGS.config, FLAGS.hparams, FLAGS.train_steps, FLAGS.train_minutes,
        FLAGS.vocab_size, FLAGS.average_checkpoints, FLAGS.num_examples,
        FLAGS.seed, FLAGS.numbers_train_size, stop, announce)
  except main_job.JobStopped as e:
    print(f"main_job: {e}", file=sys.stderr)
    return stop.exit_status or 143
  except (main_job.JobError, DataError, ValueError, OSError,
          CheckpointError, NonFiniteLossError, run_lock.RunLockedError) as e:
    print(f"main_job: error: {e}", file=sys.stderr)
    return 1
  print("\n== summary\n" + "\n".join(main_job.summary(result)))
  return 0


if __name__ == "__main__":
  command.run(main)
