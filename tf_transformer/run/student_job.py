"""The student job (bin/main_job.py --student): sequence-level distillation
of the task's model into a student that serves several times faster at
about its quality (Kim and Rush, 2016; Firefox Translations' students).

1. The teacher: the main job of the same --work_dir (`main_job.run_job`),
   which reuses a finished training and trains one first where none is.
2. Its translations of the training sources (`distillation.distill`, as
   bin/translate.py --resume: a stopped job loses no line).
3. The student: the main job again, in WORK_DIR/student, on the teacher's
   translations as targets (and the references too, with
   `with_references`): the teacher's vocabulary and width with a shallow
   decoder (`STUDENT_HPARAMS`), started from the teacher's weights (each
   stack's first layers), trained in its own time budget and exported over
   a vocabulary shortlist of its training pairs, in the dtype this CPU
   runs faster (`export_dtype`: bfloat16 only where the CPU multiplies it
   natively and the training step's probe finds it faster).
4. Both exports timed on the test sources (`export_speed.py`: one thread,
   a process of its own): CPU time of one sentence a request, and
   sentences a CPU-second at batch 32.

docs/recipes.md says how the student's shape and settings were chosen.
"""

import dataclasses
import os

from absl import logging
import tensorflow as tf

from tf_transformer import config as config_lib
from tf_transformer import cost
from tf_transformer import cpu
from tf_transformer.choices import STUDENT_HPARAMS
from tf_transformer.choices import STUDENT_SHORTLIST
from tf_transformer.run import distillation
from tf_transformer.run import export_speed
from tf_transformer.run import main_job
from tf_transformer.run import run_dir as run_dir_lib
from tf_transformer.run import runner as runner_lib
from tf_transformer.run.tasks import TASKS
from tf_transformer.training import budget
from tf_transformer.training import precision

AUTO = "auto"  # --student_dtype=auto: chosen for this CPU by `export_dtype`


@dataclasses.dataclass
class StudentResult:
  teacher: main_job.JobResult
  student: main_job.JobResult
  distilled: str  # the teacher's translations of the training sources
  distilled_now: int  # of them, the lines this job translated
  parameters: dict  # "teacher", "student" -> trainable parameters
  depths: dict  # "teacher", "student" -> (encoder layers, decoder layers)
  speed: dict  # "teacher", "student" -> export_speed.Speed
  shortlist: tuple  # the student export's (K, N)


def run_student_job(task_name="multi30k", work_dir=None, export_dir=None,
                    data_dir=None, student_hparams=STUDENT_HPARAMS,
                    student_minutes=None, student_steps=None,
                    with_references=False,
                    student_shortlist=STUDENT_SHORTLIST, student_dtype=AUTO,
                    stop=None,
                    announce=lambda stage, line: None,
                    **teacher) -> StudentResult:
  """Runs the teacher's job, the distillation and the student's job, then
  times both exports. `teacher`: the teacher's `run_job` arguments
  (train_minutes, hparams, ...); the student takes the teacher's
  architecture, learning rate schedule and dropout with `student_hparams`
  over them (at most the teacher's depths), `student_minutes` (default:
  the task's) or `student_steps`, exported in `student_dtype` ("float32",
  "bfloat16", or AUTO: `export_dtype`'s choice, announced with its
  reason). Raises what `run_job` raises, and JobError for a task without
  training files."""
  task = TASKS[task_name]
  if not task.splits:
    raise main_job.JobError(f"--student: --task={task_name} has no "
                            "training files to distill; use --task=multi30k")
  work_dir = work_dir or os.path.join("runs", task_name)
  export_dir = export_dir or os.path.join("saved_models", task_name)
  teacher_result = main_job.run_job(
      task_name, work_dir=work_dir, export_dir=export_dir, data_dir=data_dir,
      stop=stop, announce=announce, **teacher)

  stem = task.splits["train"]
  source, reference = (os.path.join(work_dir, "data", f"{stem}.{language}")
                       for language in main_job.LANGUAGES)
  student_dir = os.path.join(work_dir, "student")
  distilled = os.path.join(student_dir, "data",
                           f"{stem}.distilled.{main_job.LANGUAGES[1]}")
  announce("distill", main_job.command_line(
      "translate.py", "--resume", model=teacher_result.export, input=source,
      output=distilled))
  distilled_now = distillation.distill(
      runner_lib.open_translator(model=teacher_result.export), source,
      distilled)

  teacher_config = run_dir_lib.load_config(teacher_result.weights)
  pairs = [(source, distilled)] + ([(source, reference)] if with_references
                                   else [])
  hparams = teacher_hparams(teacher_config, student_hparams)
  dtype, reason = export_dtype(
      student_dtype, config_lib.get_config(task.config, hparams))
  logging.info("the student's export: %s", reason)
  announce("student dtype", reason)
  student_result = main_job.run_job(
      task_name, work_dir=student_dir,
      export_dir=f"{export_dir.rstrip(os.sep)}_student", data_dir=data_dir,
      hparams=hparams, train_minutes=student_minutes,
      train_steps=student_steps, export_dtype=dtype,
      mixed_precision=teacher.get("mixed_precision", "auto"), stop=stop,
      announce=announce, train_pairs=pairs,
      vocabulary_from=os.path.join(work_dir, "run"),
      export_shortlist=student_shortlist, init_from=teacher_result.weights)

  tests = teacher_result.texts["test"][0]
  parameters, depths, speed = {}, {}, {}
  for name, result, run in (("teacher", teacher_result, work_dir),
                            ("student", student_result, student_dir)):
    config = run_dir_lib.load_config(os.path.join(run, "run")).model
    parameters[name] = cost.parameter_count(config)
    depths[name] = (config.num_encoder_layers, config.num_decoder_layers)
    announce("time", f"{name}: {result.export} on {tests} at batch 32 and "
             f"one sentence at a time, one thread, in a process of its own")
    speed[name] = export_speed.measure(result.export, tests)
  return StudentResult(teacher_result, student_result, distilled,
                       distilled_now, parameters, depths, speed,
                       tuple(student_shortlist))


def cpu_probe(config, mixed_precision):
  """`precision.probe_tokens_per_sec` on the CPU, whatever GPUs there are."""
  return precision.probe_tokens_per_sec(
      config, mixed_precision,
      strategy=tf.distribute.OneDeviceStrategy("/cpu:0"))


def export_dtype(student_dtype, config, cpuinfo=cpu.CPUINFO, probe=cpu_probe):
  """The student export's dtype, and one line saying why.

  Args:
    student_dtype: --student_dtype: "float32" or "bfloat16", taken as
      given, or AUTO.
    config: the student's TransformerConfig, which AUTO's probe times.
    cpuinfo, probe: `precision.choose`'s, a test's to fake.
  Returns:
    (dtype, reason). AUTO gives what --mixed_precision=auto would choose
    for this CPU (GPUs set aside: the export is timed, and mostly served,
    on CPUs): float32 where the CPU has neither AVX512_BF16 nor AMX, whose
    bfloat16 is emulated, slower; bfloat16 where it has them and the
    probe of the student's training step finds bfloat16 faster by the
    probe's margin, else float32. A server's CPU is what decides: the
    reason says this host's.
  """
  if student_dtype != AUTO:
    return student_dtype, f"{student_dtype}, as --student_dtype gave"
  choice = precision.choose(config, cpuinfo=cpuinfo, probe=probe,
                            gpus=lambda: [])
  return (choice.mixed_precision or "float32", choice.reason
          + " (--student_dtype=float32 or bfloat16 to choose)")


def teacher_hparams(config, student_hparams):
  """--hparams of a student of `config` (a TransformerConfig): the fields a
  run sized for its budget sets (`budget.LONG_RUN_HPARAMS`) as the
  teacher has them, then `student_hparams`."""
  flat = config.flat()
  return ",".join([f"{name}={flat[name]}"
                   for name, _ in budget.LONG_RUN_HPARAMS]
                  + [student_hparams] * bool(student_hparams))


def summary(result: StudentResult):
  """The student's job summary, then the teacher and the student side by
  side: test BLEU and chrF through each export, parameters, and speed."""
  lines = main_job.summary(result.student)
  lines.append(f"\ndistilled  {result.distilled} ({result.distilled_now:,} "
               "lines translated now)")
  test = os.path.basename(result.teacher.texts["test"][0])
  lines.append(f"\n== teacher and student ({test}; CPU time at one "
               "thread)")
  header = ("model", "layers", "parameters", "BLEU", "chrF",
            "1 sentence, CPU ms", "batch 32, sentences/CPU-s")
  rows = [header]
  for name, job in (("teacher", result.teacher),
                    ("student", result.student)):
    scores, speed = job.scores["test"], result.speed[name]
    encoder, decoder = result.depths[name]
    export = job.export_dtype + (
        ", shortlist " + ",".join(map(str, result.shortlist))
        if name == "student" else "")
    rows.append((f"{name} ({export})", f"{encoder}-{decoder}",
                 f"{result.parameters[name]:,}", f"{scores['bleu']:.2f}",
                 f"{scores['chrf']:.2f}", f"{speed.one_sentence_ms:.1f}",
                 f"{speed.sentences_per_cpu_second:.1f}"))
  widths = [max(len(row[i]) for row in rows) for i in range(len(header))]
  lines += ["  ".join(cell.rjust(width) if i else cell.ljust(width)
                      for i, (cell, width) in enumerate(zip(row, widths)))
            for row in rows]
  return lines
