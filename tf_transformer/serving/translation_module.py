"""Text in, translations out, as one `tf.Module`: SentencePiece tokenization
(tensorflow-text), the search of `DecodingOptions` and detokenization, all
in the graph. `serving/export.py` saves it for TensorFlow Serving; the run
layer also uses it in-process (bin/translate.py --model_dir).

Functions (each a `tf.function` with an input signature):

- `serve`: text [batch] string -> translation [batch] string, score [batch]
  float (log P / length penalty of the best hypothesis);
- `nbest`: text -> translations [batch, n], scores [batch, n] (n: the beam
  size, or the number of samples);
- `translate_ids`: source_ids [batch, length] int32 (EOS-terminated,
  PAD-padded) -> target_ids [batch, length'], score [batch];
- `attention`: text -> translation, score, source_tokens [batch, S] and
  target_tokens [batch, T] (subwords, "" as padding, target ending with
  "</s>"), and the attention weights of the best translation in a
  teacher-forced pass, [batch, layers, heads, rows, columns]:
  encoder_self (S x S), decoder_self (T x T), encoder_decoder (T x S), for
  plots like the paper's Figures 3 to 5;
- `alignment`: text -> translation, score, source_tokens, target_tokens
  (as `attention`'s) and cross_attention [batch, layers, T, S], the
  encoder-decoder attention averaged over heads: what word alignments are
  made of (`decoding/alignment.py`), a heads-th of `attention`'s
  encoder-decoder weights and without the self-attention;
- `translate_with_prefix`: text [batch], prefix [batch] strings ->
  translation, score: each translation starts with its prefix's subwords
  (cut to the output limit) and the same search completes it
  (`decoding/prefix.py`); an empty prefix gives the plain translation;
- `score`: source [batch], target [batch] strings -> log_prob [batch] (log
  P(target | source), natural log, teacher forced, no length penalty, over
  the whole vocabulary even where the searches use a shortlist),
  token_log_probs [batch, T] (each target subword's and the EOS's, 0 as
  padding) and lengths [batch] (`decoding/scoring.py`); targets are cut to
  `max_input_tokens` + `max_decode_length_offset` subwords, the longest
  output the search gives;
- `forced_alignment`: source, target -> `score`'s outputs with
  `alignment`'s source_tokens, target_tokens and cross_attention, teacher
  forced over each given target: word alignments of given translations;
- `source_ids`: text -> the EOS-terminated, PAD-padded ids the others
  search from (what `translate_ids` takes);
- `count_input_tokens`: each text's subwords before the cut, and the limit.

Every request gets a defined answer: invalid UTF-8 bytes are replaced with
U+FFFD, inputs are cut to `max_input_tokens` subwords, outputs to source
length + `max_decode_length_offset`, and an empty batch gives empty
outputs. An input of another rank (a scalar, a [2, 2] matrix) is refused with
InvalidArgumentError "Shape of tensor text [2,2] is not compatible with
expected shape [?]": the declared [None] alone is not checked when a loaded
signature or TF Serving feeds it, and the batch would be flattened.

By default nothing is compiled with XLA, since stock TF Serving on CPU runs
with its XLA:CPU JIT off; `xla=True` compiles the search for servers
started with --xla_cpu_compilation_enabled, on requests padded to a few
shapes, so that the server compiles once per shape (a power-of-2 batch size
and a multiple of 16 subwords), not per request. `decode_parts=N` decodes
each request as N slices at once, the length-sorted sentences dealt
round-robin, for servers run with --tensorflow_intra_op_parallelism=1 and N
inter-op threads. Both are `DecodingOptions` of the one `search.decode`
(`xla`, `parts`), so they hold for every signature that searches, a target
prefix's included. So does a `shortlist` (`decoding/shortlist.py`): every
search then decodes over its request's vocabulary shortlist, scores
normalized over it; `score` stays over the whole vocabulary.
"""

import dataclasses

import keras
import tensorflow as tf

from tf_transformer.data import sequences
from tf_transformer.decoding import prefix as prefix_lib
from tf_transformer.decoding import scoring
from tf_transformer.decoding.ensemble import step_of
from tf_transformer.decoding.search import DecodingOptions
from tf_transformer.decoding.search import decode
from tf_transformer.decoding.search import refuse_xla_with_shortlist
from tf_transformer.decoding import shortlist as shortlist_lib
from tf_transformer.decoding import step_weights as step_weights_lib
from tf_transformer.special_ids import PAD_ID

ATTENTION_KINDS = ("encoder_self", "decoder_self", "encoder_decoder")


class TranslationModule(tf.Module):
  """The exported object: the model, its tokenizer and the search. It also
  serves in-process (bin/translate.py --model_dir uses it unsaved).

  Args:
    model: a `Transformer` or an `Ensemble`.
    vocabulary: the run's SentencePiece `Vocabulary`, put in the graph.
    options: `DecodingOptions`; its `xla` and `parts` are replaced by the
      two arguments below.
    max_input_tokens: source subwords kept (the rest cut, EOS after).
    xla: the search compiled by XLA on padded buckets (export --xla).
    decode_parts: independent searches a request is dealt into
      (export --decode_parts).
    shortlist: a `shortlist.Shortlist` of arrays (export --shortlist):
      every search decodes over its request's shortlist; kept as the
      export's variables. `score` stays over the whole vocabulary.
  """

  def __init__(self, model, vocabulary, options=DecodingOptions(),
               max_input_tokens=256, xla=False, decode_parts=1,
               shortlist=None):
    super().__init__()
    refuse_xla_with_shortlist(xla, shortlist is not None)
    self.model = model
    self.tokenizer = vocabulary.make_tokenizer()
    # Prefixes and scored targets are target text: an imported Marian
    # model cuts them with its target language's SentencePiece model.
    self.target_tokenizer = sequences.target_side(self.tokenizer)
    if model.config.model.positional_encoding == "learned":
      # A learned table has no rows past max_length.
      max_input_tokens = min(max_input_tokens,
                             model.config.model.max_length - 1)
      options = dataclasses.replace(options, max_decode_length_offset=min(
          options.max_decode_length_offset,
          model.config.model.max_length - max_input_tokens - 1))
    # (DecodingOptions refuses xla with parts > 1.)
    self.options = options = dataclasses.replace(options, xla=xla,
                                                 parts=decode_parts)
    self.nbest_size = options.nbest
    self.max_input_tokens = max_input_tokens
    # The longest output the search gives (EOS aside).
    self.max_output_tokens = (max_input_tokens
                              + options.max_decode_length_offset)
    # The decoding step's weights as it multiplies by them
    # (`decoding/step_weights.py`), saved with the export rather than
    # rebuilt for every request; a search reads them once, before its loop.
    weights = step_of(model).prepare(self.max_output_tokens + 2)
    if xla:  # the Keras layers encode there (static shapes): no copy
      weights = step_weights_lib.without_encoder(weights)
    if shortlist is not None:
      weights = shortlist_lib.with_output_rows(weights)
    # (The model's own variables among them, its target embeddings, are
    # kept as they are: the export stores them once.)
    self.step_weights = tf.nest.map_structure(
        lambda w: w if w is None or isinstance(w, keras.Variable)
        else tf.Variable(w, trainable=False), weights)
    self.shortlist = shortlist and shortlist_lib.Shortlist(
        *[tf.Variable(x, trainable=False) for x in shortlist])
    # One function that every signature calls (saved once, not inlined in
    # each). Held in a plain closure, not as a tf.function attribute: saving
    # traces every tf.function attribute again outside the signatures'
    # graphs, which would store the search twice more and trace it twice
    # more at each export.
    search = tf.function(self._decode, autograph=False)
    self._search = lambda *args: search(*args)
    # Likewise the teacher-forced pass that `attention`, `alignment`,
    # `score` and `forced_alignment` share: traced and saved once, not four
    # times.
    forced = tf.function(model.logits_and_attention, autograph=False)
    self._logits_and_attention = lambda *args: forced(*args)

  def _decode(self, source_ids, prefix=None):
    """`search.decode` with this module's options and stored weights: every
    signature's search, prefixed or not."""
    return decode(self.model, source_ids, self.options, prefix=prefix,
                  step_weights=self.step_weights, shortlist=self.shortlist)

  def _encode(self, text):
    return sequences.source_ids(
        self.tokenizer, text, self.max_input_tokens,
        eos=self.model.config.model.source_eos).to_tensor()

  def _if_not_empty(self, text, fn, empty):
    """fn() for a non-empty batch, else `empty`'s zero-row tensors, with
    static trailing dimensions set from `empty` (tf.cond alone would lose
    them); a 0 there stands for a length that varies."""
    results = tf.cond(tf.size(text) > 0, fn, lambda: empty)
    for result, like in zip(tf.nest.flatten(results), tf.nest.flatten(empty)):
      result.set_shape([None] + [d or None for d in like.shape[1:]])
    return results

  def _nbest(self, text):
    n = self.nbest_size

    def search():
      ids, scores = self._search(self._encode(text))
      batch = tf.shape(ids)[0]
      flat = tf.reshape(ids, [batch * n, tf.shape(ids)[2]])
      return tf.reshape(self.tokenizer.detokenize(flat), [batch, n]), scores
    return self._if_not_empty(text, search, (tf.zeros([0, n], tf.string),
                                             tf.zeros([0, n], tf.float32)))

  def _attention(self, text, kinds=ATTENTION_KINDS, heads_averaged=False):
    """The best translation, its tokens, and `kinds` of attention
    [batch, layers, heads, queries, keys] float32 (without the heads axis,
    their mean, where `heads_averaged`)."""
    def weights():
      source_ids = self._encode(text)
      target_ids, scores = self._search(source_ids)
      target_ids = _trim_padding(target_ids[:, 0])
      return (self.tokenizer.detokenize(target_ids), scores[:, 0],
              *self._teacher_forced(source_ids, target_ids, kinds,
                                    heads_averaged))
    empty = (tf.zeros([0], tf.string), tf.zeros([0]),
             *self._no_attention(kinds, heads_averaged))
    return self._if_not_empty(text, weights, empty)

  def _teacher_forced(self, source_ids, target_ids, kinds, heads_averaged):
    """Both sides' tokens and `kinds` of attention (as `_attention`'s) of a
    teacher-forced pass over `target_ids` (EOS-terminated, PAD-padded)."""
    _, attention = self._logits_and_attention(
        source_ids, sequences.decoder_input(target_ids))
    return self._attention_outputs(source_ids, target_ids, attention, kinds,
                                   heads_averaged)

  def _attention_outputs(self, source_ids, target_ids, attention, kinds,
                         heads_averaged):
    """`_teacher_forced`'s outputs of `attention` (`attention_weights`'s
    dict) from a pass over `target_ids`."""
    # Rows of padding queries are 0, as a lone request's absent rows are
    # (TF Serving's batching pads a request to its batch's longest).
    queries = {"encoder_self": source_ids, "decoder_self": target_ids,
               "encoder_decoder": target_ids}
    stacked = []
    for kind in kinds:
      stack = tf.cast(tf.stack(attention[kind], axis=1), tf.float32)
      if heads_averaged:
        stack = tf.reduce_mean(stack, axis=2)
      real = tf.cast(queries[kind] != PAD_ID, tf.float32)
      real = (real[:, tf.newaxis, :, tf.newaxis] if heads_averaged else
              real[:, tf.newaxis, tf.newaxis, :, tf.newaxis])
      stacked.append(stack * real)
    return (self._pieces(source_ids), self._pieces(target_ids), *stacked)

  def _no_attention(self, kinds, heads_averaged):
    """`_teacher_forced`'s outputs for an empty batch."""
    config = self.model.config.model
    layers = lambda kind: (config.num_encoder_layers if kind == "encoder_self"
                           else config.num_decoder_layers)
    heads = [] if heads_averaged else [config.num_heads]
    return (tf.zeros([0, 0], tf.string), tf.zeros([0, 0], tf.string)) + tuple(
        tf.zeros([0, layers(kind), *heads, 0, 0]) for kind in kinds)

  def _pieces(self, ids):
    return tf.where(ids == PAD_ID, "", self.tokenizer.id_to_string(ids))

  @tf.function(input_signature=[tf.TensorSpec([None], tf.string)],
               autograph=False)
  def serve(self, text):
    """The default signature.

    Args:
      text: [batch] strings.
    Returns:
      {"translation": [batch] strings, "score": [batch] float32, log P(Y|X) /
      lp(Y) as `search.decode` scores}.
    """
    texts, scores = self._nbest(_checked(text))
    return {"translation": texts[:, 0], "score": scores[:, 0]}

  @tf.function(input_signature=[tf.TensorSpec([None], tf.string)],
               autograph=False)
  def nbest(self, text):
    """Args:
      text: [batch] strings.
    Returns:
      {"translations": [batch, nbest] strings, "scores": [batch, nbest]},
      best first.
    """
    texts, scores = self._nbest(_checked(text))
    return {"translations": texts, "scores": scores}

  @tf.function(input_signature=[tf.TensorSpec([None, None], tf.int32)],
               autograph=False)
  def translate_ids(self, source_ids):
    """Args:
      source_ids: [batch, length] int32 as `source_ids` makes them.
    Returns:
      {"target_ids": [batch, length] int32, PAD after EOS, "score": [batch]}.
    """
    ids, scores = self._search(_checked(source_ids))
    return {"target_ids": ids[:, 0], "score": scores[:, 0]}

  @tf.function(input_signature=[tf.TensorSpec([None], tf.string)],
               autograph=False)
  def attention(self, text):
    """The best translation and every attention distribution behind it.

    Args:
      text: [batch] strings.
    Returns:
      {"translation", "score" (as `serve`'s), "source_tokens",
      "target_tokens", and per kind of attention [batch, layers, heads,
      queries, keys] float32}.
    """
    results = self._attention(_checked(text))
    return dict(zip(("translation", "score", "source_tokens",
                     "target_tokens") + ATTENTION_KINDS, results))

  @tf.function(input_signature=[tf.TensorSpec([None], tf.string)],
               autograph=False)
  def alignment(self, text):
    """What word alignments are made of (`decoding/alignment.py`): the best
    translation and each decoder layer's encoder-decoder attention
    (section 3.2.3), averaged over its heads. A heads-th of `attention`'s
    encoder-decoder weights, and neither self-attention.

    Args:
      text: [batch] strings.
    Returns:
      {"translation", "score" (as `serve`'s), "source_tokens" [batch, S],
      "target_tokens" [batch, T] (pieces, "" as padding), "cross_attention"
      [batch, layers, T, S] float32}.
    """
    results = self._attention(_checked(text), ("encoder_decoder",),
                              heads_averaged=True)
    return dict(zip(("translation", "score", "source_tokens",
                     "target_tokens", "cross_attention"), results))

  @tf.function(input_signature=[tf.TensorSpec([None], tf.string)] * 2,
               autograph=False)
  def translate_with_prefix(self, text, prefix):
    """Translations that start with given target text (autocompletion).

    Args:
      text: [batch] source strings.
      prefix: [batch] target strings ("" for none), tokenized as targets.
    Returns:
      {"translation": [batch] strings, "score": [batch] float32, the prefix's
      tokens included}.
    """
    text, prefix = _same_size(
        _checked(text), _checked(prefix),
        "translate_with_prefix: text and prefix must hold as many strings")

    def search():
      forced = prefix_lib.from_ragged(sequences.subwords(
          self.target_tokenizer, prefix)[:, :self.max_output_tokens])
      ids, scores = self._search(self._encode(text), forced)
      return self.tokenizer.detokenize(ids[:, 0]), scores[:, 0]
    translation, score = self._if_not_empty(
        text, search, (tf.zeros([0], tf.string), tf.zeros([0])))
    return {"translation": translation, "score": score}

  @tf.function(input_signature=[tf.TensorSpec([None], tf.string)] * 2,
               autograph=False)
  def score(self, source, target):
    """Forced decoding: how likely the model finds each target. Over the
    full vocabulary.

    Args:
      source, target: [batch] strings.
    Returns:
      `scoring.score_texts`'s dict.
    """
    source, target = _same_size(
        _checked(source), _checked(target),
        "score: source and target must hold as many strings")
    empty = {"log_prob": tf.zeros([0]), "token_log_probs": tf.zeros([0, 0]),
             "lengths": tf.zeros([0], tf.int32)}
    return self._if_not_empty(
        source, lambda: self._forced(source, target)[0], empty)

  def _forced(self, source, target):
    """`scoring.score_texts`'s dict for (source, target) strings, with the
    source ids, the labels as a [batch, T] tensor and the attention of the
    same pass: the shared teacher-forced function (the logits are the
    model's call's, to the bit) gives `score` and `forced_alignment`
    alike."""
    source_ids = self._encode(source)
    labels = scoring.target_labels(self.target_tokenizer, target,
                                   self.max_output_tokens)
    target_ids = labels.to_tensor()
    logits, attention = self._logits_and_attention(
        source_ids, sequences.decoder_input(target_ids))
    scored = scoring.scores_of(scoring.label_log_probs(logits, labels), labels)
    return scored, source_ids, target_ids, attention

  @tf.function(input_signature=[tf.TensorSpec([None], tf.string)] * 2,
               autograph=False)
  def forced_alignment(self, source, target):
    """Word alignments of given translations (what `marian-scorer
    --alignment` gives): `score`'s outputs, and `alignment`'s tokens and
    cross_attention from a teacher-forced pass over each target, cut as
    `score` cuts it.

    Args:
      source, target: [batch] strings.
    Returns:
      {"log_prob", "token_log_probs", "lengths" (as `score`'s),
      "source_tokens" [batch, S], "target_tokens" [batch, T] (pieces, ""
      as padding, each target ending with "</s>"), "cross_attention"
      [batch, layers, T, S] float32, heads averaged}.
    """
    source, target = _same_size(
        _checked(source), _checked(target),
        "forced_alignment: source and target must hold as many strings")
    names = ("log_prob", "token_log_probs", "lengths", "source_tokens",
             "target_tokens", "cross_attention")

    def aligned():
      # One teacher-forced pass gives the scores and the attention alike.
      scored, source_ids, target_ids, attention = self._forced(source,
                                                               target)
      return (scored["log_prob"], scored["token_log_probs"],
              scored["lengths"], *self._attention_outputs(
                  source_ids, target_ids, attention, ("encoder_decoder",),
                  heads_averaged=True))
    empty = (tf.zeros([0]), tf.zeros([0, 0]), tf.zeros([0], tf.int32),
             *self._no_attention(("encoder_decoder",), heads_averaged=True))
    return dict(zip(names, self._if_not_empty(source, aligned, empty)))

  @tf.function(input_signature=[tf.TensorSpec([None], tf.string)],
               autograph=False)
  def source_ids(self, text):
    """The encoder input the signatures make of `text`
    (`data/sequences.source_ids`: subwords cut to `max_input_tokens`, then
    EOS; PAD-padded), which is what `translate_ids` takes. Saved with the
    export but not a serving signature."""
    return {"source_ids": self._encode(_checked(text))}

  @tf.function(input_signature=[tf.TensorSpec([None], tf.string)],
               autograph=False)
  def count_input_tokens(self, text):
    """Each text's subwords before the cut to `max_input_tokens`, and that
    limit: what a client needs to warn about cut inputs. Saved with the
    export but not a serving signature."""
    lengths = sequences.subwords(self.tokenizer,
                                 _checked(text)).row_lengths()
    return {"tokens": tf.cast(lengths, tf.int32),
            "max_input_tokens": tf.constant(self.max_input_tokens, tf.int32)}


def _checked(tensor):
  """`tensor`, after a run-time check that it has its declared shape (an
  EnsureShape op, which graph optimization keeps, unlike a rank test)."""
  return tf.ensure_shape(tensor, tensor.shape)


def _same_size(a, b, message):
  """`a` and `b` once an Assert has found them of one size: their uses wait
  for it, so a mismatched request fails with `message`. (A bare Assert in a
  tf.function runs beside the search, whose own shape error could come
  first.)"""
  check = tf.debugging.assert_equal(tf.size(a), tf.size(b), message=message)
  with tf.control_dependencies([check]):
    return tf.identity(a), tf.identity(b)


def _trim_padding(ids):
  """Drops the columns that are PAD in every row."""
  length = tf.reduce_max(tf.reduce_sum(tf.cast(ids != PAD_ID, tf.int32), 1))
  return ids[:, :length]
