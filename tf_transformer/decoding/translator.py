"""Text to translations from an exported SavedModel or a checkpoint, in
batches: what bin/translate.py and bin/evaluate.py share."""

import tensorflow as tf

from tf_transformer.decoding import text as text_decoding
from tf_transformer.decoding.search import model_beam_search


class Translator:
  """`translate(texts) -> [[(translation, score), ...n-best], ...]`."""

  def __init__(self, nbest_fn, beam_size):
    self._nbest_fn = nbest_fn
    self.beam_size = beam_size

  @classmethod
  def from_saved_model(cls, path):
    import tensorflow_text  # noqa: F401  pylint: disable=unused-import
    loaded = tf.saved_model.load(path)
    nbest = loaded.signatures["nbest"]
    beam_size = int(nbest.structured_outputs["scores"].shape[-1])

    def nbest_fn(texts):
      out = nbest(text=tf.constant(texts, tf.string, shape=[len(texts)]))
      return out["translations"].numpy(), out["scores"].numpy()
    return cls(nbest_fn, beam_size)

  @classmethod
  def from_model_dir(cls, model_dir, beam_size=None, alpha=None,
                     max_length_offset=None, checkpoint=None):
    from tf_transformer.training import run_dir  # pylint: disable=g-import-not-at-top
    model, vocabulary = run_dir.load_trained_model(model_dir, checkpoint)
    c = model.config
    beam_size = beam_size or c.beam_size
    search = tf.function(lambda ids: model_beam_search(
        model, ids, beam_size,
        c.length_penalty_alpha if alpha is None else alpha,
        c.max_decode_length_offset if max_length_offset is None
        else max_length_offset))

    def nbest_fn(texts):
      ids, scores = search(text_decoding.encode_sources(vocabulary, texts))
      batch = ids.shape[0]
      flat = tf.reshape(ids, [batch * beam_size, -1])
      decoded = vocabulary.detokenize(flat).numpy().reshape(batch, beam_size)
      return decoded, scores.numpy()
    return cls(nbest_fn, beam_size)

  def translate(self, texts, nbest=1, batch_size=32):
    if not 1 <= nbest <= self.beam_size:
      raise ValueError(f"--nbest={nbest}: must be between 1 and the beam "
                       f"size {self.beam_size}")
    results = []
    for start in range(0, len(texts), batch_size):
      decoded, scores = self._nbest_fn(list(texts[start:start + batch_size]))
      for row, row_scores in zip(decoded, scores):
        results.append([(t.decode("utf-8"), float(s))
                        for t, s in zip(row[:nbest], row_scores[:nbest])])
    return results
