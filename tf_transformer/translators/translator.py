"""Lines to translations through an export (a SavedModel or a CTranslate2
directory) or an in-process `TranslationModule`, in batches: what
bin/translate.py, bin/evaluate.py and the main job share."""

import tensorflow as tf

from tf_transformer.data.text_batches import batch_indices, in_input_order
from tf_transformer.decoding import alignment as alignment_lib
from tf_transformer.interop import ct2
from tf_transformer.translators import ct2_runtime
from tf_transformer.serving import export as export_lib


class Translator:
  """`translate(texts) -> [[(translation, score), ...n-best], ...]` over
  one export or module; built by `from_export` or `from_module`.

  Args:
    nbest_fn: texts -> (translations [n, nbest] bytes, scores [n, nbest]).
    nbest_size: the hypotheses `nbest_fn` gives a text.
    count_fn: texts -> (subwords per text, the input limit).
    prefix_fn: (texts, prefixes) -> (best translations, their scores).
    align_fn: (texts, decoder layer from 1 or None) -> [(translation,
      score, Pharaoh pairs)], one a text (from the `alignment` signature or
      `CT2Decoder.aligned`).
  """

  def __init__(self, nbest_fn, nbest_size, count_fn, prefix_fn, align_fn):
    self._nbest_fn = nbest_fn
    self.nbest_size = nbest_size
    self._count_fn = count_fn  # texts -> (subwords per text, input limit)
    # (texts, prefixes) -> (best translations, their scores)
    self._prefix_fn = prefix_fn
    self._align_fn = align_fn

  @classmethod
  def from_export(cls, path, compute_type="default"):
    """A translator over an export, whichever kind it is.

    Args:
      path: a SavedModel version directory (bin/export.py) or a
        CTranslate2 directory (bin/export.py --format=ctranslate2), told
        apart by their files.
      compute_type: CTranslate2's ("int8" quantizes at load).
    Returns:
      The `Translator`; FileNotFoundError naming `path` if it is neither.
    """
    if ct2.is_ct2_model(path):
      decoder = ct2_runtime.CT2Decoder(path, compute_type)
      return cls(decoder.nbest, decoder.nbest_size,
                 decoder.count_input_tokens, decoder.translate_with_prefix,
                 decoder.aligned)
    if tf.saved_model.contains_saved_model(path):
      return cls.from_saved_model(path)
    hint = ""
    complete = [version for version in export_lib.versions(path) if
                tf.saved_model.contains_saved_model(f"{path}/{version}")]
    if complete:
      hint = ("; pass one of its version folders, e.g. the newest, "
              f"{path.rstrip('/')}/{complete[-1]}")
    raise FileNotFoundError(
        f"{path}: neither a SavedModel (saved_model.pb) nor a CTranslate2 "
        f"model ({ct2.MODEL_FILE}){hint}")

  @classmethod
  def from_saved_model(cls, path):
    """A translator over a SavedModel version directory's signatures
    (`nbest`, `translate_with_prefix`, `alignment`) and its
    `count_input_tokens`."""
    loaded = load_saved_model(path)
    nbest = loaded.signatures["nbest"]
    nbest_size = int(nbest.structured_outputs["scores"].shape[-1])
    return cls(_nbest_fn(nbest), nbest_size,
               counter_of(loaded.count_input_tokens),
               _prefix_fn(loaded.signatures["translate_with_prefix"]),
               _align_fn(loaded.signatures["alignment"]))

  @classmethod
  def from_module(cls, module):
    """A translator over a `TranslationModule` run in-process (the run
    layer builds one from a checkpoint: `run.loading`).

    Args:
      module: the `TranslationModule`.
    Returns:
      The `Translator`.
    """
    return cls(_nbest_fn(lambda **kw: module.nbest(**kw)), module.nbest_size,
               counter_of(module.count_input_tokens),
               _prefix_fn(lambda **kw: module.translate_with_prefix(**kw)),
               _align_fn(lambda **kw: module.alignment(**kw)))

  def _prefixed(self, texts, nbest, prefixes):
    """translate's search with prefixes: (batch, indices into `texts`) ->
    (translations, scores), one a text. Raises ValueError naming the flag
    where prefixes cannot be used."""
    if nbest != 1:
      raise ValueError(f"--nbest={nbest} with --target_prefix: a prefix "
                       "gives one translation a line")
    if len(prefixes) != len(texts):
      raise ValueError(f"{len(prefixes)} prefixes for {len(texts)} inputs: "
                       "the prefix file must be line-aligned with the input")

    def search(batch, indices):
      translations, scores = self._prefix_fn(
          batch, [prefixes[i] for i in indices])
      return ([[t] for t in translations], [[s] for s in scores])
    return search

  def input_warnings(self, texts, name="input", shown=5, first=1):
    """What the model will not translate as given.

    Args:
      texts: the input lines.
      name: what the messages call the input (a file name).
      shown: line numbers named per message.
      first: the first text's line number.
    Returns:
      Up to two messages: the empty lines (the model still answers
      something) and the lines cut to the export's input limit, each
      naming up to `shown` line numbers (from 1).
    """
    empty = [i for i, text in enumerate(texts, first) if not text.strip()]
    messages = []
    if empty:
      messages.append(
          f"{_lines(empty, shown)} of {name} {_are(empty)} empty; "
          f"{_their(empty)} translation is whatever the model says for "
          "nothing")
    if texts:
      counts, limit = subword_counts(self._count_fn, texts)
      cut = [(i, n) for i, n in enumerate(counts, first) if n > limit]
      if cut:
        longest = max(n for _, n in cut)
        messages.append(
            f"{_lines([i for i, _ in cut], shown)} of {name} {_are(cut)} "
            f"longer than the model's input limit of {limit} subwords (up to "
            f"{longest:,}) and will be cut to the first {limit}; split such "
            "lines into sentences")
    return messages

  def translate(self, texts, nbest=1, batch_size=32, progress=None,
                prefixes=None, batch_tokens=0):
    """Translates lines in batches.

    Args:
      texts: the input lines.
      nbest: hypotheses kept a line, at most `nbest_size`.
      batch_size: texts a batch.
      progress: a `progress.Progress`, told of each translated batch.
      prefixes: one a text ("" for none): each translation starts with its
        prefix, completed by the same search (one translation a text).
      batch_tokens: > 0: the texts are sorted by length and cut into
        batches of at most that many source subwords, padding included,
        and at most `batch_size` texts (`length_batches`); else batches of
        `batch_size` in file order.
    Returns:
      [[(translation, score), ...nbest], ...] in the texts' order. Raises
      ValueError naming the flag (--nbest, --target_prefix) it cannot
      honour.
    """
    if not 1 <= nbest <= self.nbest_size:
      raise ValueError(f"--nbest={nbest}: must be between 1 and the "
                       f"{self.nbest_size} hypotheses this decoding gives "
                       "(the beam size, or --num_samples when sampling)")
    search = lambda batch, indices: self._nbest_fn(batch)
    if prefixes is not None:
      search = self._prefixed(texts, nbest, prefixes)
    def run(indices):
      decoded, scores = search([texts[i] for i in indices], indices)
      return [[(t.decode("utf-8"), float(s))
               for t, s in zip(row[:nbest], row_scores[:nbest])]
              for row, row_scores in zip(decoded, scores)]
    return self._in_batches(texts, batch_size, batch_tokens, run, progress)

  def translate_aligned(self, texts, layer=None, batch_size=32,
                        progress=None, batch_tokens=0):
    """Translates lines in batches, each with its word alignment
    (`decoding/alignment.py`).

    Args:
      texts: the input lines.
      layer: the decoder layer whose attention aligns, from 1 (default:
        the last).
      batch_size, progress, batch_tokens: as `translate`'s.
    Returns:
      [(translation, score, alignment), ...] in the texts' order, the
      alignment as Pharaoh pairs "i-j" of source and translation words.
      Raises ValueError naming --alignment where the export cannot align.
    """
    return self._in_batches(
        texts, batch_size, batch_tokens,
        lambda indices: self._align_fn([texts[i] for i in indices], layer),
        progress)

  def _in_batches(self, texts, batch_size, batch_tokens, run, progress):
    """`run`'s results over the `batch_indices` of `texts` (by their
    `input_lengths`), in the texts' order."""
    return list(in_input_order(len(texts), batch_indices(
        len(texts), batch_size, batch_tokens,
        lambda: self.input_lengths(texts)), run, progress))

  def input_lengths(self, texts):
    """Each text's source length as the model sees it.

    Args:
      texts: the input lines.
    Returns:
      Its subwords, cut to the input limit, plus EOS, a text.
    """
    return token_lengths(self._count_fn, texts)


# What every SavedModel of release 1.0 holds: signatures, and functions.
SIGNATURES = ("serving_default", "nbest", "ids", "translate_with_prefix",
              "score", "attention", "alignment", "forced_alignment")
FUNCTIONS = ("count_input_tokens", "source_ids")


def load_saved_model(path):
  """The SavedModel version directory `path`, loaded (with the SentencePiece
  ops), once it holds every signature and function of `SIGNATURES` and
  `FUNCTIONS`; ValueError naming what an older export lacks."""
  import tensorflow_text  # noqa: F401  pylint: disable=unused-import,g-import-not-at-top
  loaded = tf.saved_model.load(path)
  missing = [name for name in SIGNATURES if name not in loaded.signatures]
  missing += [name for name in FUNCTIONS if not hasattr(loaded, name)]
  if missing:
    raise ValueError(f"{path}: an export of a release before 1.0 (it has no "
                     f"{', '.join(missing)}): export it again")
  return loaded


def token_lengths(count_fn, texts):
  """Each text's length as a model reads it: its subwords, cut to the
  input limit, plus EOS (`count_fn`: texts -> (subwords per text, the
  limit))."""
  counts, limit = subword_counts(count_fn, texts)
  return [min(n, limit) + 1 for n in counts]


def subword_counts(count_fn, texts):
  """(each text's subwords before the cut, the input limit), counted by
  `count_fn`, the model's own tokenizer, 1,024 texts a call."""
  counts, limit = [], 0
  for start in range(0, len(texts), 1024):
    chunk, limit = count_fn(list(texts[start:start + 1024]))
    counts += [int(n) for n in chunk]
  return counts, limit


def string_batch(texts):
  """[len(texts)] tf.string: what every signature takes, an empty batch
  too (a plain tf.constant of [] would be float32)."""
  return tf.constant(texts, tf.string, shape=[len(texts)])


def _nbest_fn(nbest):
  def translate(texts):
    out = nbest(text=string_batch(texts))
    return out["translations"].numpy(), out["scores"].numpy()
  return translate


def _align_fn(alignment):
  def align(texts, layer):
    out = alignment(text=string_batch(texts))
    return alignment_lib.aligned(
        {key: value.numpy() for key, value in out.items()}, layer)
  return align


def _prefix_fn(translate_with_prefix):
  def translate(texts, prefixes):
    out = translate_with_prefix(text=string_batch(texts),
                                prefix=string_batch(prefixes))
    return out["translation"].numpy(), out["score"].numpy()
  return translate


def counter_of(count_input_tokens):
  """`token_lengths`' count_fn over a `count_input_tokens` function (an
  export's or a module's)."""
  def count(texts):
    out = count_input_tokens(string_batch(texts))
    return out["tokens"].numpy(), int(out["max_input_tokens"])
  return count


def _lines(numbers, shown):
  listed = ", ".join(str(n) for n in numbers[:shown])
  more = f" and {len(numbers) - shown:,} more" if len(numbers) > shown else ""
  return f"line{'s' if len(numbers) > 1 else ''} {listed}{more}"


def _are(items):
  return "are" if len(items) > 1 else "is"


def _their(items):
  return "their" if len(items) > 1 else "its"
