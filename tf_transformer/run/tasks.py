"""The main job's tasks (bin/main_job.py --task): each one's preset, sizes,
schedule, splits and dev metric. Importable without TensorFlow, so that the
command checks --task before TensorFlow loads."""

import dataclasses
from typing import Optional


# README.md's Multi30k run: its steps and epochs in its 20 minutes, and the
# host (the first row of README's results by CPU; tests/test_docs.py).
MULTI30K_SHOWN_STEPS = 1248
MULTI30K_SHOWN_EPOCHS = 8.6
MULTI30K_SHOWN_HOST = "AMD Zen 4 (AVX-512, AVX512_BF16)"


@dataclasses.dataclass(frozen=True)
class Shown:
  """The run README.md shows for a task: how far its budget took it on the
  host it ran on (the job compares this host's budget with it)."""
  steps: int
  epochs: float
  minutes: float
  host: str


@dataclasses.dataclass(frozen=True)
class Task:
  config: str
  vocab_size: int
  train_steps: Optional[int]  # None: the preset's, bounded by the minutes
  train_minutes: Optional[float]
  checkpoint_every_steps: Optional[int]  # None: train_steps // 10
  eval_every_steps: Optional[int]  # None: train_steps // 3
  splits: dict  # our split name -> the task's file stem
  # The dev metric that keeps the best checkpoint during training and
  # chooses between it and the average (`best.METRICS`).
  best_metric: str
  shown: Optional[Shown] = None  # README.md's run (tests/test_docs.py)


TASKS = {
    # Each German number is one word: no 4-grams, so BLEU is about 0 for
    # any output, and exact match tells the models apart.
    "numbers": Task("tiny", 1000, 1000, None, None, None, {}, "exact_match"),
    # 20 minutes are 650 to 2,500 steps of 4,096 tokens on 2 cores, by
    # the host: checkpoints go by time where minutes bound the run (_cadence).
    "multi30k": Task("small_corpus", 8000, None, 20, 100, 500,
                     {"train": "train", "dev": "val",
                      "test": "test_2016_flickr"}, "bleu",
                     Shown(MULTI30K_SHOWN_STEPS, MULTI30K_SHOWN_EPOCHS, 20,
                           MULTI30K_SHOWN_HOST)),
}
