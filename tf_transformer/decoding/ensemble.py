"""Several trained Transformers of one vocabulary decoding as one model: at
each step the search scores the next token by the members' distributions
combined, as fairseq, OpenNMT-py and Marian ensemble; the paper's
"ensembles" of Table 2 rows are such combinations.

    ensemble = Ensemble([model_a, model_b])     # same vocabulary
    ids, scores = decode(ensemble, source_ids)  # decoding/search.py

`Ensemble` offers what an export (`TranslationModule`) and forced scoring
ask of a `Transformer` (a teacher-forced call, `attention_weights`,
`config`), and `EnsembleStep` what a search asks of
`decoding/step.Step`. Each member keeps its own memory, cache and step
weights (tuples, one entry a member), so members may differ in depth,
width or heads; only the vocabulary must be the same.

Two ways to combine, over the members' log-softmax outputs log p_i:
- "log_probs" (default): their mean, (1/n) sum_i log p_i, as OpenNMT-py
  does by default and Marian with equal weights; the search's log-softmax
  renormalizes it (a normalized geometric mean of the p_i);
- "probs": log of the mean probability, log (1/n) sum_i p_i, as fairseq
  does (OpenNMT-py's -avg_raw_probs).
An ensemble of one decodes exactly as its model does.
"""

import math

import tensorflow as tf

from tf_transformer.choices import AVERAGES
from tf_transformer.decoding.step import Step


class Ensemble(tf.Module):
  """Members of one vocabulary, combined at each step.

  Args:
    members: `Transformer`s sharing one vocabulary; they may differ in
      depth, width or heads.
    average: "log_probs" (the mean of the log-probabilities) or "probs"
      (the log of the mean probability).
  """

  def __init__(self, members, average="log_probs"):
    super().__init__()
    members = list(members)
    if not members:
      raise ValueError("an ensemble needs at least one model")
    if average not in AVERAGES:
      raise ValueError(f"average={average!r}: one of {AVERAGES}")
    sizes = [m.config.model.vocab_size for m in members]
    if len(set(sizes)) > 1:
      raise ValueError(f"the members' vocabularies differ in size ({sizes}): "
                       "an ensemble's members must share one vocabulary")
    starts = {m.config.model.decoder_start for m in members}
    if len(starts) > 1:
      raise ValueError(f"the members' decoder_start differ ({sorted(starts)}):"
                       " an ensemble's members must share one vocabulary")
    if len({m.config.model.source_eos for m in members}) > 1:
      raise ValueError("the members' source_eos differ: an ensemble's "
                       "members read one source sequence")
    self.members = members
    self.average = average
    # The member whose limits bind: a learned position table has no rows
    # past its max_length, so the shortest such table decides the lengths.
    learned = [m for m in members
               if m.config.model.positional_encoding == "learned"]
    self.lead = min(learned, key=lambda m: m.config.model.max_length,
                    default=members[0])

  @property
  def config(self):
    """The lead member's config: its decoding part and length limits are
    the ensemble's."""
    return self.lead.config

  def combine(self, logits):
    """The ensemble's log-probabilities.

    Args:
      logits: a list, one entry a member, of [..., vocab].
    Returns:
      [..., vocab] float32 log-probabilities.
    """
    log_probs = [tf.nn.log_softmax(tf.cast(x, tf.float32)) for x in logits]
    if len(log_probs) == 1:
      return log_probs[0]
    if self.average == "log_probs":
      return tf.add_n(log_probs) / len(log_probs)
    return (tf.reduce_logsumexp(tf.stack(log_probs), axis=0)
            - math.log(len(log_probs)))

  def __call__(self, inputs, training=False):
    """Teacher forcing: the combined log-probabilities [batch, T, vocab]
    of (source_ids, target_input_ids), used as logits."""
    return self.combine([m(inputs, training=training) for m in self.members])

  def attention_weights(self, source_ids, target_input_ids):
    """The members' attention distributions averaged where all members have
    the lead's layers and heads (fairseq averages them too), else the
    lead's alone (`Transformer.attention_weights`)."""
    if not self._one_attention_shape():
      return self.lead.attention_weights(source_ids, target_input_ids)
    weights = [m.attention_weights(source_ids, target_input_ids)
               for m in self.members]
    return self._averaged(weights)

  def logits_and_attention(self, source_ids, target_input_ids):
    """`__call__`'s combined log-probabilities and `attention_weights`'s
    distributions, from one teacher-forced pass of each member."""
    passes = [m.logits_and_attention(source_ids, target_input_ids)
              for m in self.members]
    combined = self.combine([logits for logits, _ in passes])
    if not self._one_attention_shape():
      return combined, passes[self.members.index(self.lead)][1]
    return combined, self._averaged([weights for _, weights in passes])

  def _one_attention_shape(self):
    """Whether every member has the lead's layers and heads, so that their
    attention distributions can be averaged."""
    shape = lambda m: (m.config.model.num_encoder_layers,
                       m.config.model.num_decoder_layers,
                       m.config.model.num_heads)
    return all(shape(m) == shape(self.lead) for m in self.members)

  @staticmethod
  def _averaged(weights):
    return {kind: [tf.add_n([tf.cast(w[kind][layer], tf.float32)
                             for w in weights]) / len(weights)
                   for layer in range(len(weights[0][kind]))]
            for kind in weights[0]}


class EnsembleStep:
  """`decoding/step.Step` for an `Ensemble`: each member's step, the
  log-probabilities combined (`Ensemble.combine`)."""

  def __init__(self, ensemble, static=False):
    self.ensemble = ensemble
    self.steps = [Step(m, static) for m in ensemble.members]

  @property
  def config(self):
    return self.ensemble.config

  def encode(self, source_ids, weights=None):
    """(memories, one a member; the source padding mask); `weights`: the
    members' prepared ones, or None (`Step.encode`)."""
    weights = weights or (None,) * len(self.steps)
    encoded = [s.encode(source_ids, w) for s, w in zip(self.steps, weights)]
    return tuple(memory for memory, _ in encoded), encoded[0][1]

  def prepare(self, max_positions):
    return tuple(s.prepare(max_positions) for s in self.steps)

  def initial_cache(self, weights, memory, max_length, group_size=1):
    return tuple(s.initial_cache(w, x, max_length, group_size)
                 for s, w, x in zip(self.steps, weights, memory))

  def __call__(self, ids, position, cache, source_mask, weights):
    """(combined log-probabilities [rows, vocab], cache)."""
    steps = [s(ids, position, c, source_mask, w)
             for s, c, w in zip(self.steps, cache, weights)]
    return (self.ensemble.combine([logits for logits, _ in steps]),
            tuple(c for _, c in steps))

  def reorder(self, cache, parents):
    return tuple(s.reorder(c, parents) for s, c in zip(self.steps, cache))

  def select(self, cache, sentences):
    return tuple(s.select(c, sentences) for s, c in zip(self.steps, cache))

  def sentence_axes(self, cache):
    return tuple(s.sentence_axes(c) for s, c in zip(self.steps, cache))


def step_of(model, static=False):
  """The decoding step a search runs.

  Args:
    model: a `Transformer` or an `Ensemble`.
    static: keep every shape static, for XLA.
  Returns:
    A `step.Step` or an `EnsembleStep`.
  """
  if isinstance(model, Ensemble):
    return EnsembleStep(model, static)
  return Step(model, static)
