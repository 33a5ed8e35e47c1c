"""Where the text pairs of each split come from: one `DataSpec`, from flags.

`dataset="numbers"` is the embedded generated task; any other non-empty
`dataset` is a TFDS name; an empty `dataset` means local files
(`train_source`/`train_target`, or a TSV file as `train_source` alone).
Splits are "train", "dev" and "test".
"""

import dataclasses
import functools
from typing import Callable, Iterator, Optional, Tuple

from tf_transformer.data import corpora
from tf_transformer.data import errors
from tf_transformer.data import numbers
from tf_transformer.data import tfds_corpora
from tf_transformer.data.errors import DataError

SPLITS = ("train", "dev", "test")
TFDS_SPLITS = {"train": "train", "dev": "validation", "test": "test"}


@dataclasses.dataclass(frozen=True)
class DataSpec:
  """Everything needed to read the text pairs of any split."""
  dataset: str = "numbers"
  train_source: Optional[str] = None
  train_target: Optional[str] = None
  dev_source: Optional[str] = None
  dev_target: Optional[str] = None
  test_source: Optional[str] = None
  test_target: Optional[str] = None
  source_language: str = "en"
  target_language: str = "de"
  data_dir: Optional[str] = None
  manual_dir: Optional[str] = None
  numbers_train_size: int = numbers.DEFAULT_SIZES["train"]
  seed: int = 0

  def check(self) -> "DataSpec":
    local = any((self.train_source, self.train_target))
    if self.dataset and local:
      raise DataError(f"--dataset={self.dataset} and --train_source/"
                      "--train_target both given; pass --dataset= (empty) to "
                      "train on local files")
    if not self.dataset and not self.train_source:
      raise DataError("no training data: pass --dataset (numbers or a TFDS "
                      "name) or --train_source and --train_target")
    return self

  def files(self, split: str) -> Tuple[Optional[str], Optional[str]]:
    return getattr(self, f"{split}_source"), getattr(self, f"{split}_target")


@functools.lru_cache(maxsize=4)
def _numbers(train_size: int, seed: int, source_language: str,
             target_language: str):
  sizes = dict(numbers.DEFAULT_SIZES, train=train_size)
  return numbers.generate(sizes, seed, source_language, target_language)


def has_split(spec: DataSpec, split: str) -> bool:
  if spec.dataset:
    return True
  return bool(spec.files(split)[0])


def text_pairs(spec: DataSpec, split: str,
               stats: Optional[corpora.ReadStats] = None
               ) -> Callable[[], Iterator[tuple]]:
  """A function that yields the (source, target) pairs of `split` each time
  it is called; read errors surface as `DataError` while iterating (and
  are `errors.remembered`, so `errors.unwrapped` finds them when tf.data or
  SentencePiece wraps them)."""
  if split not in SPLITS:
    raise DataError(f"split {split!r}: expected one of {SPLITS}")
  spec.check()
  if spec.dataset == "numbers":
    data = _numbers(spec.numbers_train_size, spec.seed, spec.source_language,
                    spec.target_language)[split]
    def generate():
      if stats is not None:
        stats.pairs = len(data)
      return iter(data)
    return generate
  if spec.dataset:
    return lambda: errors.remembered(tfds_corpora.read_tfds(
        spec.dataset, TFDS_SPLITS[split], spec.source_language,
        spec.target_language, spec.data_dir, spec.manual_dir, stats=stats))
  source, target = spec.files(split)
  if not source:
    raise DataError(f"--{split}_source: no {split} data given")
  return lambda: errors.remembered(corpora.read_local(source, target, stats))
