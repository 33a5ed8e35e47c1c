"""Text to translations from an exported SavedModel or a checkpoint, in
batches: what bin/translate.py and bin/evaluate.py share."""

import tensorflow as tf

from tf_transformer.decoding.search import DecodingOptions


def one_line(text):
  """A translation on one line: a model can emit line breaks (byte
  fallback), which would shift every later line of a line-aligned file."""
  return " ".join(text.splitlines())


def output_lines(results, nbest_format, show_scores=False, start=0):
  """What bin/translate.py and bin/serving_client.py print for `results`
  ([[(text, score), ...], ...], one list per input numbered from `start`):
  `INDEX ||| TEXT ||| SCORE` per hypothesis with `nbest_format`, else the
  best text, prefixed by `SCORE<TAB>` with `show_scores`."""
  lines = []
  for index, hypotheses in enumerate(results, start):
    if nbest_format:
      lines += [f"{index} ||| {one_line(t)} ||| {s:.4f}"
                for t, s in hypotheses]
    else:
      text, score = hypotheses[0]
      text = one_line(text)
      lines.append(f"{score:.4f}\t{text}" if show_scores else text)
  return lines


class Translator:
  """`translate(texts) -> [[(translation, score), ...n-best], ...]`."""

  def __init__(self, nbest_fn, nbest_size):
    self._nbest_fn = nbest_fn
    self.nbest_size = nbest_size

  @classmethod
  def from_saved_model(cls, path):
    import tensorflow_text  # noqa: F401  pylint: disable=unused-import
    loaded = tf.saved_model.load(path)
    nbest = loaded.signatures["nbest"]
    nbest_size = int(nbest.structured_outputs["scores"].shape[-1])

    def nbest_fn(texts):
      out = nbest(text=tf.constant(texts, tf.string, shape=[len(texts)]))
      return out["translations"].numpy(), out["scores"].numpy()
    return cls(nbest_fn, nbest_size)

  @classmethod
  def from_model_dir(cls, model_dir, checkpoint=None, **options):
    """A checkpoint run in-process through the export's own graph code;
    `options`: DecodingOptions fields (None keeps the config's)."""
    # pylint: disable=g-import-not-at-top
    from tf_transformer.serving.export import TranslationModule
    from tf_transformer.training import run_dir
    model, vocabulary = run_dir.load_trained_model(model_dir, checkpoint)
    module = TranslationModule(
        model, vocabulary, DecodingOptions.from_config(model.config,
                                                       **options))

    def nbest_fn(texts):
      out = module.nbest(tf.constant(texts, tf.string, shape=[len(texts)]))
      return out["translations"].numpy(), out["scores"].numpy()
    return cls(nbest_fn, module.nbest_size)

  def translate(self, texts, nbest=1, batch_size=32):
    if not 1 <= nbest <= self.nbest_size:
      raise ValueError(f"--nbest={nbest}: must be between 1 and the "
                       f"{self.nbest_size} hypotheses this decoding gives "
                       "(the beam size, or --num_samples when sampling)")
    results = []
    for start in range(0, len(texts), batch_size):
      decoded, scores = self._nbest_fn(list(texts[start:start + batch_size]))
      for row, row_scores in zip(decoded, scores):
        results.append([(t.decode("utf-8"), float(s))
                        for t, s in zip(row[:nbest], row_scores[:nbest])])
    return results
