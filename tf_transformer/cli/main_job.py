r"""The main job, end to end with the repository's own commands: build the
vocabulary, train, average the last checkpoints, export a SavedModel for TF
Serving, score dev and test through it, and translate examples through it
next to their references.

  bin/main_job.py                        # the embedded numbers task, ~4 min
  bin/main_job.py --task=multi30k --data_dir=../shared/data/multi30k
                                         # real captions, ~25 min on 2 cores
  bin/main_job.py --task=multi30k --data_dir=../shared/data/multi30k --student
                                         # then a distilled student

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

--student then distills that model into a student
(`tf_transformer/run/student_job.py`): its translations of the training
sources (resumed where a stopped job left them) become the targets of a
student with its encoder and one decoder layer, started from its weights,
trained in WORK_DIR/student and exported over a vocabulary shortlist in
the dtype this CPU runs faster (--student_dtype); the job ends with the
teacher and the student side by side.
"""

import sys

from absl import flags

from tf_transformer import command
from tf_transformer.data.errors import DataError
from tf_transformer.run import job_flags
from tf_transformer.training import interruption
from tf_transformer.training import run_lock

FLAGS = flags.FLAGS
job_flags.define_flags()


def main(argv):
  del argv
  # pylint: disable=g-import-not-at-top  (TensorFlow after the flags)
  from tf_transformer.run import main_job
  from tf_transformer.run import student_job
  from tf_transformer.training.checkpoints import CheckpointError
  from tf_transformer.training.trainer import DivergedError
  stop = interruption.StopRequest().install()
  announce = lambda stage, line: print(f"\n== {stage}: {line}", flush=True)
  job, summary = ((student_job.run_student_job, student_job.summary)
                  if FLAGS.student else (main_job.run_job, main_job.summary))
  try:
    result = job(stop=stop, announce=announce, **job_flags.job_arguments())
  except main_job.JobStopped as e:
    print(f"main_job: {e}", file=sys.stderr)
    command.exit_now(stop.exit_status or 143)  # everything is saved
  except (main_job.JobError, DataError, ValueError, OSError,
          CheckpointError, DivergedError, run_lock.RunLockedError) as e:
    return command.fail("main_job", e, 1)
  print("\n== summary\n" + "\n".join(summary(result)))
  return 0


def run():
  """`tf-transformer-main-job`: parses the flags, then runs `main`."""
  command.run(main)
