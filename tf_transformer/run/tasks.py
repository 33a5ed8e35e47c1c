"""The main job's tasks (bin/main_job.py --task): each one's preset, sizes,
schedule, splits and dev metric. Importable without TensorFlow, so that the
command checks --task before TensorFlow loads."""

import dataclasses
from typing import Optional


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


TASKS = {
    # Each German number is one word: no 4-grams, so BLEU is about 0 for
    # any output, and exact match tells the models apart.
    "numbers": Task("tiny", 1000, 1000, None, None, None, {}, "exact_match"),
    # 20 minutes are 650 to 1,800 steps of 4,096 tokens on 2 cores, by
    # the host: checkpoints go by time where minutes bound the run (_cadence).
    "multi30k": Task("small_corpus", 8000, None, 20, 100, 500,
                     {"train": "train", "dev": "val",
                      "test": "test_2016_flickr"}, "bleu"),
}
