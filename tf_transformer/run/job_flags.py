"""absl flags of bin/main_job.py, and the `run_job` arguments they mean."""

from absl import flags

from tf_transformer.run.tasks import TASKS
from tf_transformer.choices import DTYPES

# Flags that are `run_job` arguments of the same name (--task is task_name).
JOB_ARGUMENTS = ("work_dir", "export_dir", "data_dir", "config", "hparams",
                 "train_steps", "train_minutes", "vocab_size",
                 "average_checkpoints", "num_examples", "seed",
                 "numbers_train_size", "export_dtype", "mixed_precision")


def define_flags():
  flags.DEFINE_enum("task", "numbers", sorted(TASKS), "numbers: the "
                    "embedded generated task; multi30k: the Multi30k "
                    "captions in --data_dir.")
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
  flags.DEFINE_integer("train_steps", None, "Optimizer updates (default: "
                       "the task's; numbers 1000).")
  flags.DEFINE_float("train_minutes", None, "Training time budget (default: "
                     "the task's; multi30k 20).")
  flags.DEFINE_integer("vocab_size", None, "Shared vocabulary size "
                       "(default: the task's; numbers 1000, multi30k 8000).")
  flags.DEFINE_integer("average_checkpoints", 5, "Checkpoints averaged.")
  flags.DEFINE_integer("num_examples", 8, "Test sentences shown at the end.")
  flags.DEFINE_integer("seed", 0, "Seed of data, initialization and order.")
  flags.DEFINE_enum("export_dtype", "float32", list(DTYPES),
                    "The export's weights and matmuls (bin/export.py "
                    "--dtype).")
  flags.DEFINE_enum("mixed_precision", "auto",
                    ["auto", "float32", "bfloat16", "float16"],
                    "Train in mixed precision (bin/train.py "
                    "--mixed_precision); auto: chosen for this CPU.")
  flags.DEFINE_integer("numbers_train_size", None, "Training pairs (default: "
                       "the task's 40,000); fewer for a quick try.")


def job_arguments(values=None) -> dict:
  """`run_job` keyword arguments from the flags."""
  values = values or flags.FLAGS
  arguments = {name: values[name].value for name in JOB_ARGUMENTS}
  arguments["task_name"] = values.task
  return arguments
