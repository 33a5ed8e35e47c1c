"""The SavedModel that TensorFlow Serving loads: text in, translations out.

SentencePiece tokenization and detokenization (tensorflow-text) and beam
search run inside the graph, so a client sends raw strings. Signatures:

- `serving_default`: text [batch] string -> translation [batch] string,
  score [batch] float (log P / length penalty of the best hypothesis);
- `nbest`: text -> translations [batch, beam], scores [batch, beam];
- `ids`: source_ids [batch, length] int32 (EOS-terminated, PAD-padded) ->
  target_ids [batch, length'], score [batch].

Every request gets a defined answer: invalid UTF-8 bytes are replaced with
U+FFFD, inputs are cut to `max_input_tokens` subwords, outputs to source
length + `max_length_offset`, and an empty batch gives empty outputs.

By default nothing is compiled with XLA, since stock TF Serving on CPU runs
with its XLA:CPU JIT off; `xla=True` exports the search compiled for servers
started with --xla_cpu_compilation_enabled.
"""

import os

import tensorflow as tf

from tf_transformer.decoding.search import model_beam_search
from tf_transformer.special_ids import EOS_ID


class TranslationModule(tf.Module):
  """The exported object: the model, its tokenizer and the search."""

  def __init__(self, model, vocabulary, beam_size=4, alpha=0.6,
               max_length_offset=50, max_input_tokens=256, xla=False):
    super().__init__()
    self.model = model
    self.tokenizer = vocabulary.make_tokenizer()
    self.beam_size = beam_size
    self.alpha = alpha
    self.max_length_offset = max_length_offset
    if model.config.positional_encoding == "learned":
      # A learned table has no rows past max_length.
      max_input_tokens = min(max_input_tokens, model.config.max_length - 1)
      self.max_length_offset = min(
          max_length_offset, model.config.max_length - max_input_tokens - 1)
    self.max_input_tokens = max_input_tokens
    model.set_xla_attention(False)
    self._search = tf.function(self._search_ids, jit_compile=xla)

  def _search_ids(self, source_ids):
    return model_beam_search(self.model, source_ids, self.beam_size,
                             self.alpha, self.max_length_offset)

  def _encode(self, text):
    text = tf.strings.unicode_transcode(text, "UTF-8", "UTF-8",
                                        errors="replace")
    pieces = self.tokenizer.tokenize(text)[:, :self.max_input_tokens]
    eos = tf.fill([pieces.nrows(), 1], EOS_ID)
    return tf.concat([pieces, eos], axis=1).to_tensor()

  def _nbest(self, text):
    def search():
      ids, scores = self._search(self._encode(text))
      batch = tf.shape(ids)[0]
      flat = tf.reshape(ids, [batch * self.beam_size, tf.shape(ids)[2]])
      texts = tf.reshape(self.tokenizer.detokenize(flat),
                         [batch, self.beam_size])
      return texts, scores

    def nothing():
      return (tf.zeros([0, self.beam_size], tf.string),
              tf.zeros([0, self.beam_size], tf.float32))

    texts, scores = tf.cond(tf.size(text) > 0, search, nothing)
    # The beam axis is static, so clients can read the beam from the
    # signature (tf.cond alone would leave it unknown).
    texts.set_shape([None, self.beam_size])
    scores.set_shape([None, self.beam_size])
    return texts, scores

  @tf.function(input_signature=[tf.TensorSpec([None], tf.string)])
  def serve(self, text):
    texts, scores = self._nbest(text)
    return {"translation": texts[:, 0], "score": scores[:, 0]}

  @tf.function(input_signature=[tf.TensorSpec([None], tf.string)])
  def nbest(self, text):
    texts, scores = self._nbest(text)
    return {"translations": texts, "scores": scores}

  @tf.function(input_signature=[tf.TensorSpec([None, None], tf.int32)])
  def translate_ids(self, source_ids):
    ids, scores = self._search(source_ids)
    return {"target_ids": ids[:, 0], "score": scores[:, 0]}


def next_version_dir(export_dir):
  """export_dir/<integer>, one above the highest version already there."""
  versions = [int(name) for name in tf.io.gfile.listdir(export_dir)
              if name.strip("/").isdigit()] if tf.io.gfile.exists(
                  export_dir) else []
  return os.path.join(export_dir, str(max(versions, default=0) + 1))


def export(module: TranslationModule, export_dir: str) -> str:
  """Writes the next version of `export_dir`; returns its path."""
  path = next_version_dir(export_dir)
  tf.saved_model.save(module, path, signatures={
      "serving_default": module.serve, "nbest": module.nbest,
      "ids": module.translate_ids})
  return path
