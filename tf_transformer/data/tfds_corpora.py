"""Translation datasets from TensorFlow Datasets, in the direction asked for.

`wmt14_translate/de-en` with source `en` and target `de` is the paper's
English-to-German recipe; `wmt_t2t_translate/de-en` and
`ted_hrlr_translate/pt_to_en` work alike. TFDS downloads need the internet; a
prepared copy in `--data_dir` (or raw files in a manual directory) works
without it.
"""

from typing import Iterator, Optional

from tf_transformer.data import pipeline_options
from tf_transformer.data.corpora import Pair, ReadStats, keep_pair
from tf_transformer.data.errors import DataError

OFFLINE_HELP = (
    "TFDS needs the internet to download {name}. Without it, prepare the "
    "dataset on a machine that has it (`tfds build {name} --data_dir=DIR`) and "
    "pass --data_dir=DIR here, or put the raw archives in a manual directory "
    "and pass --tfds_manual_dir; or use local files (--train_source / "
    "--train_target).")


def _builder(name: str, data_dir: Optional[str]):
  import tensorflow_datasets as tfds  # heavy import; only when used
  try:
    return tfds.builder(name, data_dir=data_dir)
  except tfds.core.registered.DatasetNotFoundError:
    raise DataError(f"--dataset={name}: no such TFDS dataset; translation "
                    "datasets include wmt14_translate/de-en, "
                    "wmt_t2t_translate/de-en, ted_hrlr_translate/pt_to_en, or "
                    "use --dataset=numbers") from None


def read_tfds(name: str, split: str, source_language: str,
              target_language: str, data_dir: Optional[str] = None,
              manual_dir: Optional[str] = None, download: bool = True,
              stats: Optional[ReadStats] = None) -> Iterator[Pair]:
  """(source, target) text pairs of one TFDS split."""
  import tensorflow_datasets as tfds
  stats = stats if stats is not None else ReadStats()
  builder = _builder(name, data_dir)
  languages = tuple(builder.info.features.keys())
  for flag, language in (("--source_language", source_language),
                         ("--target_language", target_language)):
    if language not in languages:
      raise DataError(f"{flag}={language}: {name} has languages {languages}")
  if split not in builder.info.splits and builder.info.splits:
    raise DataError(f"split {split!r}: {name} has splits "
                    f"{sorted(builder.info.splits)}")
  try:
    if download:
      config = tfds.download.DownloadConfig(manual_dir=manual_dir)
      builder.download_and_prepare(download_config=config)
    dataset = builder.as_dataset(split=split)
  except DataError:
    raise
  except Exception as e:  # network, missing manual files, partial downloads
    raise DataError(f"{name}: could not load split {split!r} "
                    f"({type(e).__name__}: {e}). "
                    + OFFLINE_HELP.format(name=name)) from None
  for example in pipeline_options.without_autotuning(
      dataset).as_numpy_iterator():
    source = example[source_language].decode("utf-8")
    target = example[target_language].decode("utf-8")
    if keep_pair(source, target, stats):
      yield source, target
  if stats.pairs == 0:
    raise DataError(f"{name} split {split!r}: no sentence pairs")
