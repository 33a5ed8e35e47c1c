"""absl flags of bin/main_job.py, and the `run_job` arguments they mean."""

from absl import flags

from tf_transformer.run.tasks import TASKS
from tf_transformer.choices import DTYPES
from tf_transformer.choices import STUDENT_HPARAMS
from tf_transformer.choices import STUDENT_SHORTLIST

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
                    "--mixed_precision); auto: chosen for this host's GPUs "
                    "where TensorFlow sees any, else for its CPU.")
  flags.DEFINE_integer("numbers_train_size", None, "Training pairs (default: "
                       "the task's 40,000); fewer for a quick try.")
  flags.DEFINE_bool("student", False, "After the job (whose training is "
                    "reused where finished), distill its model: translate "
                    "the training sources with it, train a student with its "
                    "encoder and one decoder layer on them, from its "
                    "weights, in WORK_DIR/student, export it to "
                    "EXPORT_DIR_student (shortlist "
                    f"{','.join(map(str, STUDENT_SHORTLIST))}, dtype by "
                    "--student_dtype) and time both (docs/recipes.md). "
                    "--task=multi30k.")
  flags.DEFINE_float("student_minutes", None, "--student: the student's "
                     "training budget (default: the task's).")
  flags.DEFINE_integer("student_steps", None, "--student: the student's "
                       "optimizer updates (default: the preset's, bounded "
                       "by --student_minutes).")
  flags.DEFINE_string("student_hparams", STUDENT_HPARAMS,
                      "--student: the student's overrides of the teacher's "
                      "architecture and schedule; its depths at most the "
                      "teacher's, whose first layers start each stack.")
  flags.DEFINE_enum("student_dtype", "auto", ["auto"] + list(DTYPES),
                    "--student: the student export's weights and matmuls; "
                    "auto: bfloat16 where this CPU multiplies it natively "
                    "(AVX512_BF16 or AMX) and a probe of the student's "
                    "training step finds it faster, else float32 (logged "
                    "with the reason). Serve it where its dtype is fast.")
  flags.DEFINE_bool("student_with_references", False, "--student: train on "
                    "the references too, beside the teacher's "
                    "translations (two corpora, drawn alike).")


def job_arguments(values=None) -> dict:
  """`run_job` keyword arguments from the flags; with --student,
  `run_student_job`'s."""
  values = values or flags.FLAGS
  arguments = {name: values[name].value for name in JOB_ARGUMENTS}
  arguments["task_name"] = values.task
  if values.student:
    arguments.update(student_hparams=values.student_hparams,
                     student_minutes=values.student_minutes,
                     student_steps=values.student_steps,
                     student_dtype=values.student_dtype,
                     with_references=values.student_with_references)
  return arguments
