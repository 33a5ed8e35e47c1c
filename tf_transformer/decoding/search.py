"""Decoding a `Transformer`: beam search (section 6.1, the default), greedy
decoding or sampling, behind one `decode(model, source_ids, options)`.

Every method returns n-best lists with comparable scores, log P(Y|X) / lp(Y)
with GNMT's lp(Y) = ((5 + |Y|) / 6)^alpha: beam search keeps `beam_size`
hypotheses, sampling draws `num_samples` and sorts them, greedy gives one.
"""

import dataclasses
from typing import Optional

import tensorflow as tf

from tf_transformer.decoding.beam_search import beam_search
from tf_transformer.decoding.beam_search import length_penalty
from tf_transformer.decoding.beam_search import tile_beams
from tf_transformer.decoding.greedy import greedy_search
from tf_transformer.decoding.greedy import sample_search
from tf_transformer.layers import decoding_cache
from tf_transformer.special_ids import PAD_ID

METHODS = ("beam", "greedy", "sample")


@dataclasses.dataclass(frozen=True)
class DecodingOptions:
  """How to decode. The defaults are the paper's (section 6.1); the parsing
  preset's are beam_size=21, alpha=0.3, max_length_offset=300 (6.3)."""
  method: str = "beam"
  beam_size: int = 4
  alpha: float = 0.6
  max_length_offset: int = 50
  temperature: float = 1.0
  top_k: int = 0
  num_samples: int = 1
  seed: Optional[int] = None

  def __post_init__(self):
    checks = [
        (self.method in METHODS, f"method={self.method!r}: one of {METHODS}"),
        (self.beam_size >= 1, f"beam_size={self.beam_size}: must be >= 1"),
        (self.alpha >= 0, f"alpha={self.alpha}: must be >= 0"),
        (self.max_length_offset >= 1,
         f"max_length_offset={self.max_length_offset}: must be >= 1"),
        (self.temperature > 0,
         f"temperature={self.temperature}: must be > 0"),
        (self.top_k >= 0, f"top_k={self.top_k}: must be >= 0 (0 = all)"),
        (self.num_samples >= 1,
         f"num_samples={self.num_samples}: must be >= 1"),
    ]
    for ok, message in checks:
      if not ok:
        raise ValueError(message)

  @classmethod
  def from_config(cls, config, **overrides):
    """The config's beam_size, alpha and offset, then `overrides` that are
    not None."""
    values = dict(beam_size=config.beam_size,
                  alpha=config.length_penalty_alpha,
                  max_length_offset=config.max_decode_length_offset)
    values.update({k: v for k, v in overrides.items() if v is not None})
    return cls(**values)

  @property
  def nbest(self) -> int:
    """Hypotheses returned per sentence."""
    return {"beam": self.beam_size, "greedy": 1,
            "sample": self.num_samples}[self.method]


def decode(model, source_ids, options=DecodingOptions(), max_length=None):
  """(ids [batch, nbest, length], scores [batch, nbest]), best first, for
  `source_ids` [batch, source_length] (EOS-terminated, PAD-padded).
  `max_length` (beam search only) fixes the buffers' length for XLA."""
  if options.method == "beam":
    return model_beam_search(model, source_ids, options.beam_size,
                             options.alpha, options.max_length_offset,
                             max_length)
  n = options.nbest
  batch = tf.shape(source_ids)[0]
  if options.method == "greedy":
    ids, log_probs = greedy_search(model, source_ids,
                                   options.max_length_offset)
  else:
    ids, log_probs = sample_search(
        model, tile_beams(source_ids, n), options.temperature, options.top_k,
        options.max_length_offset, options.seed)
  lengths = tf.reduce_sum(tf.cast(ids != PAD_ID, tf.int32), axis=1)
  scores = tf.reshape(log_probs / length_penalty(lengths, options.alpha),
                      [batch, n])
  ids = tf.reshape(ids, [batch, n, -1])
  scores, order = tf.math.top_k(scores, k=n)
  return tf.gather(ids, order, batch_dims=1), scores


def model_beam_search(model, source_ids, beam_size=4, alpha=0.6,
                      max_length_offset=50, max_length=None):
  """(ids [batch, beam, length], scores [batch, beam]) for `source_ids`
  [batch, source_length] (EOS-terminated, PAD-padded). Each output has at
  most its source length + `max_length_offset` tokens; `max_length` fixes
  the buffers' length (a static shape, for XLA), else it is the longest
  limit of the batch."""
  batch_size = tf.shape(source_ids)[0]
  memory, source_mask = model.encode(source_ids)
  limits = tf.reduce_sum(tf.cast(source_mask, tf.int32), 1) + max_length_offset
  if max_length is None:
    max_length = tf.maximum(tf.reduce_max(limits), 1)  # an empty batch too
  # The beams share their sentence's memory; only `ancestors` is reordered.
  # The source mask rides in the search's cache, so that it follows the
  # sentences still searching.
  cache = {"decoder": model.initial_cache(memory, max_length,
                                          group_size=beam_size),
           "source_mask": source_mask}
  decoder = model.decoder

  def symbols_to_logits(ids, step, cache):
    logits, decoder_cache = model.decode(ids, None, cache["source_mask"],
                                         cache=cache["decoder"], step=step)
    return logits, dict(cache, decoder=decoder_cache)

  def reorder_cache(cache, parents):
    return dict(cache, decoder=decoder.reorder_cache(cache["decoder"],
                                                     parents))

  def select_cache(cache, sentences):
    return {"decoder": decoder.select_sentences(cache["decoder"], sentences),
            "source_mask": tf.gather(cache["source_mask"], sentences)}

  # Under XLA every shape stays static: no sentence leaves the batch.
  compact = not decoding_cache.in_xla()
  return beam_search(
      symbols_to_logits, cache, batch_size, limits, max_length, beam_size,
      alpha, reorder_cache=reorder_cache,
      select_cache=select_cache if compact else None,
      cache_batch_axes={"decoder": decoder.sentence_axes(cache["decoder"]),
                        "source_mask": 0} if compact else None)
