"""absl flags that pick a model and a decoding, for bin/ scripts (defined
without importing TensorFlow: `tf_transformer.choices`)."""

import dataclasses
import itertools
import sys
from typing import Iterable, Optional

from absl import app
from absl import flags

from tf_transformer.choices import AVERAGES
from tf_transformer.choices import DECODING_BOUNDS
from tf_transformer.choices import METHODS
from tf_transformer.data import corpora
from tf_transformer.data.errors import DataError
from tf_transformer.run import model_path

DECODING_FLAGS = ("decoding", "beam_size", "alpha", "max_length_offset",
                  "temperature", "top_k", "top_p", "num_samples",
                  "sampling_seed", "min_length", "no_repeat_ngram_size")


def define_decoding_flags():
  """The DecodingOptions fields; None keeps the model config's value
  (beam 4, alpha 0.6, +50 for the paper's presets; 21, 0.3, +300 for
  `parsing`)."""
  flags.DEFINE_enum("decoding", None, list(METHODS), "Search: beam (the "
                    "paper's, default), greedy, or sample.")
  flags.DEFINE_integer("beam_size", None, "Beam size (default: the "
                       "config's, 4).", lower_bound=1)
  flags.DEFINE_float("alpha", None, "Length penalty alpha (default: the "
                     "config's, 0.6).", lower_bound=0.0)
  flags.DEFINE_integer("max_length_offset", None, "Output tokens allowed "
                       "beyond the input length (default: the config's, 50).",
                       lower_bound=1)
  flags.DEFINE_float("temperature", None, "Sampling: softmax temperature "
                     "(default 1).")
  flags.DEFINE_integer("top_k", None, "Sampling: draw from the k most "
                       "likely tokens only (default 0 = all).")
  flags.DEFINE_float("top_p", None, "Sampling: then from the fewest most "
                     "likely tokens whose probabilities sum to at least p "
                     "(nucleus sampling; default 1 = all).")
  flags.DEFINE_integer("num_samples", None, "Sampling: hypotheses drawn per "
                       "sentence, returned best first (default 1).")
  flags.DEFINE_integer("sampling_seed", None, "Sampling: a seed for "
                       "reproducible draws (default: new draws each call).")
  flags.DEFINE_integer("min_length", None, "Every search: no EOS before "
                       "this many tokens after the target prefix "
                       "(CTranslate2's min_decoding_length; default 0).")
  flags.DEFINE_integer("no_repeat_ngram_size", None, "Every search: never "
                       "output an n-gram of this many tokens twice "
                       "(CTranslate2's and fairseq's; default 0 = off).")
  # The bounds DecodingOptions checks, in its words: refused before
  # TensorFlow loads.
  for name, (test, why) in DECODING_BOUNDS.items():
    flags.register_validator(
        name, lambda value, test=test: value is None or test(value), why)


def decoding_overrides(values=None) -> dict:
  """The decoding flags given, as DecodingOptions.from_config overrides."""
  values = values or flags.FLAGS
  overrides = {name: values[name].value for name in DECODING_FLAGS}
  overrides["method"] = overrides.pop("decoding")
  overrides["seed"] = overrides.pop("sampling_seed")
  overrides["length_penalty_alpha"] = overrides.pop("alpha")
  overrides["max_decode_length_offset"] = overrides.pop("max_length_offset")
  return overrides


def define_shortlist_flag():
  """--shortlist=K,N: search over a vocabulary shortlist of the run's
  table (bin/build_shortlist.py)."""
  flags.DEFINE_string(
      "shortlist", None, "K,N (e.g. 20,300): every search decodes over its "
      "batch's shortlist, the K best target pieces of each source piece in "
      "the run's table (bin/build_shortlist.py) and the N most frequent, "
      "scores normalized there (docs/serving.md). Default: the whole "
      "vocabulary.")
  register_shortlist_validator("shortlist")


def register_shortlist_validator(name):
  """Refuses a --`name` that is not K,N, naming the flag."""
  flags.register_validator(
      name, lambda value: value is None or parse_shortlist(value) is not None,
      f"--{name}: expected K,N, two integers >= 0 with K + N > 0, e.g. "
      f"--{name}=20,300")


def parse_shortlist(value):
  """(K, N) of a K,N shortlist value, or None where it is not one."""
  parts = value.split(",")
  if len(parts) != 2 or not all(p.strip().isdigit() for p in parts):
    return None
  k, n = (int(p) for p in parts)
  return (k, n) if k + n > 0 else None


def shortlist(values=None):
  """--shortlist as (K, N), or None."""
  value = (values or flags.FLAGS).shortlist
  return None if value is None else parse_shortlist(value)


def define_flags():
  flags.DEFINE_string("model", None, "An export (a SavedModel version "
                      "NAME/VERSION or a CTranslate2 directory) or a run "
                      "directory; told apart by their files.")
  flags.DEFINE_multi_string(
      "model_dir", None, "Or runs: a training run or averaged model; "
      "repeated (--model_dir=A --model_dir=B, runs or RUN/ckpt-N checkpoints "
      "of one vocabulary), an ensemble of them.")
  define_batching_flags()


def define_batching_flags(items="Sentences", tokens="source subwords"):
  """--batch_size and --batch_tokens, read by `batching`; `items`: what a
  batch holds, `tokens`: what its budget counts, for the help."""
  flags.DEFINE_integer("batch_size", None, f"{items} per batch with "
                       "--batch_tokens=0 (default 32); with --batch_tokens, "
                       "at most this many (default: no limit).",
                       lower_bound=1)
  flags.DEFINE_integer("batch_tokens", 2048, "Sort the input by length and "
                       f"batch it by this many {tokens}, padding "
                       "included (OpenNMT-tf's, fairseq's and Marian's "
                       "batching); outputs stay in input order. 0: batches "
                       "of --batch_size in input order.", lower_bound=0)
  define_decoding_flags()
  define_ensemble_flag()
  define_shortlist_flag()


def define_buffer_flag(items="Input lines", work="translated",
                       terminal=""):
  """--buffer_lines (bin/translate.py, bin/score.py): how many inputs are
  sorted, batched and answered before the next are; `items`, `work` and
  `terminal` (its default at a terminal), for the help."""
  flags.DEFINE_integer(
      "buffer_lines", 10_000, f"{items} sorted by length and {work} "
      "together, their output written and flushed before the next are "
      "(Marian's maxi-batch, fairseq's --buffer-size): output flows on a "
      "long input, and a stopped run keeps what it wrote. 0: the whole "
      f"input at once.{terminal}", lower_bound=0)


@dataclasses.dataclass
class InputBuffers:
  """A command's input in --buffer_lines buffers (`input_buffers`)."""
  buffers: Iterable  # (first line number, lines)
  lines: Optional[list]  # every line, where read whole; None: streamed
  interactive: bool  # stdin is a terminal


def input_buffers(path, whole=False, values=None, skip=0) -> InputBuffers:
  """--input (`path`) or stdin in --buffer_lines buffers: a file, or stdin
  with `whole`, read whole (`corpora.line_windows`; its first `skip` lines,
  done before, left out of the buffers); else stdin as it comes
  (`corpora.stdin_windows`), its first buffer read at once (so that a bad
  line there is named before TensorFlow loads), and a line a buffer at a
  terminal unless --buffer_lines is given."""
  values = values or flags.FLAGS
  interactive = not path and sys.stdin.isatty()
  window = (1 if interactive and not values["buffer_lines"].present
            else values.buffer_lines)
  if path or whole or not window:
    lines = corpora.read_input(path)
    return InputBuffers(corpora.line_windows(lines, window, skip), lines,
                        interactive)
  buffers = corpora.stdin_windows(window)
  first = list(itertools.islice(buffers, 1))
  return InputBuffers(itertools.chain(first, buffers), None, interactive)


def define_alignment_flags(sources, added="Append ' ||| ' and the word "
                           "alignment to each translation"):
  """--alignment and --alignment_layer (bin/translate.py,
  bin/serving_client.py, bin/score.py); `sources`: what can align, and
  `added`: what --alignment adds to the output, for the help."""
  flags.DEFINE_bool("alignment", False, f"{added}: source-target word "
                    "pairs (from 0) as '0-0 1-2', from the encoder-decoder "
                    f"attention ({sources}).")
  flags.DEFINE_integer("alignment_layer", None, "--alignment: the decoder "
                       "layer (from 1) whose attention, averaged over its "
                       "heads, aligns (default: the last).", lower_bound=1)
  flags.register_multi_flags_validator(
      ["alignment", "alignment_layer"],
      lambda f: f["alignment"] or f["alignment_layer"] is None,
      "--alignment_layer is read only with --alignment")


def define_ensemble_flag():
  """How an ensemble (several --model_dir) combines its members."""
  flags.DEFINE_enum("ensemble_average", "log_probs", list(AVERAGES),
                    "With several --model_dir: average the members' "
                    "log-probabilities at each step (OpenNMT-py's default, "
                    "Marian's), or their probabilities (fairseq's).")


def batching(values=None):
  """(batch_size, batch_tokens) for `Translator.translate` from the
  flags."""
  values = values or flags.FLAGS
  if values.batch_tokens:
    return values.batch_size or 1_000_000, values.batch_tokens
  return values.batch_size or 32, 0


def check_model_flags(values=None):
  """What `make_translator` refuses before it loads anything (no
  TensorFlow): a UsageError unless exactly one of --model and --model_dir
  is given, and decoding flags only with a run."""
  values = values or flags.FLAGS
  if bool(values.model) == bool(values.model_dir):
    raise app.UsageError("pass exactly one of --model and --model_dir")
  given = [f"--{name}" for name in DECODING_FLAGS
           if values[name].value is not None]
  for name in ("ensemble_average", "shortlist"):
    if values[name].present:
      given.append(f"--{name}")
  if values.model and given and not model_path.is_run(values.model):
    raise app.UsageError(f"{', '.join(given)}: the decoding is fixed in an "
                         "export; re-export, or pass the run")


def make_translator(values=None):
  """`runner.open_translator` of --model or --model_dir and the decoding
  flags (a `Translator`); a UsageError names what is wrong."""
  from tf_transformer.run import runner  # pylint: disable=g-import-not-at-top
  values = values or flags.FLAGS
  check_model_flags(values)
  try:
    return runner.open_translator(values.model, values.model_dir,
                                  values.ensemble_average,
                                  shortlist(values),
                                  **decoding_overrides(values))
  except (ValueError, DataError) as e:
    raise app.UsageError(str(e)) from e
