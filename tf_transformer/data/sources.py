"""Where the text pairs of each split come from: one `DataSpec`, from flags.

`dataset="numbers"` is the embedded generated task; any other non-empty
`dataset` is a TFDS name; an empty `dataset` means local files
(`train_source`/`train_target`, or a TSV file as `train_source` alone).
Splits are "train", "dev" and "test".
"""

import dataclasses
import functools
from typing import Callable, Iterator, Optional, Tuple

from tf_transformer.choices import SPLITS
from tf_transformer.data import corpora as corpora_lib
from tf_transformer.data import errors
from tf_transformer.data import numbers
from tf_transformer.data import tfds_corpora
from tf_transformer.data.errors import DataError

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
  # Several local training corpora: comma-separated `train_source` (and
  # `train_target`) files, each batch drawn from one of them by these
  # comma-separated weights (default: equal), as OpenNMT-tf's
  # `train_files_weights`.
  train_weights: Optional[str] = None

  def check(self) -> "DataSpec":
    local = any((self.train_source, self.train_target))
    if self.dataset and local:
      raise DataError(f"--dataset={self.dataset} and --train_source/"
                      "--train_target both given; pass --dataset= (empty) to "
                      "train on local files")
    if not self.dataset and not self.train_source:
      raise DataError("no training data: pass --dataset (numbers or a TFDS "
                      "name) or --train_source and --train_target")
    self.weights()
    return self

  def weights(self) -> Tuple[float, ...]:
    """The sampling weight of each training corpus (`corpora`)."""
    sources_ = _split(self.train_source)
    targets = _split(self.train_target)
    if targets and len(targets) != len(sources_):
      raise DataError(f"--train_source names {len(sources_)} files and "
                      f"--train_target {len(targets)}; give one target file "
                      "for each source file, in the same order")
    if not self.train_weights:
      return (1.0,) * max(len(sources_), 1)
    if self.dataset:
      raise DataError("--train_weights applies to local corpora "
                      "(--dataset= with several --train_source files)")
    try:
      weights = tuple(float(w) for w in _split(self.train_weights))
    except ValueError:
      weights = ()
    if len(weights) != len(sources_) or not all(w > 0 for w in weights):
      raise DataError(f"--train_weights={self.train_weights}: expected "
                      f"{len(sources_)} positive numbers, one for each "
                      "--train_source file")
    return weights

  def files(self, split: str) -> Tuple[Optional[str], Optional[str]]:
    return getattr(self, f"{split}_source"), getattr(self, f"{split}_target")


def _split(files: Optional[str]) -> list:
  return [f.strip() for f in files.split(",") if f.strip()] if files else []


def corpora(spec: DataSpec) -> list:
  """(name, weight, spec) of each training corpus: one ("train") unless
  several local files are given ("train0", "train1", ...), each spec
  reading only its own."""
  spec.check()
  sources_ = _split(spec.train_source)
  if len(sources_) <= 1:
    return [("train", 1.0, spec)]
  targets = _split(spec.train_target) or [None] * len(sources_)
  return [(f"train{i}", weight, dataclasses.replace(
      spec, train_source=source, train_target=target, train_weights=None))
          for i, (source, target, weight) in enumerate(
              zip(sources_, targets, spec.weights()))]


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
               stats: Optional[corpora_lib.ReadStats] = None
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
  if split == "train" and len(corpora(spec)) > 1:
    return _chained([one for _, _, one in corpora(spec)], split, stats)
  source, target = spec.files(split)
  if not source:
    raise DataError(f"--{split}_source: no {split} data given")
  return lambda: errors.remembered(corpora_lib.read_local(source, target,
                                                          stats))


def _chained(specs, split, stats):
  """The pairs of each spec's `split` in turn, their counts summed into
  `stats`."""
  def read():
    for one in specs:
      counts = corpora_lib.ReadStats()
      yield from text_pairs(one, split, counts)()
      if stats is not None:
        stats.pairs += counts.pairs
        stats.skipped.update(counts.skipped)
  return read
