"""Decoding a `Transformer`: beam search (section 6.1, the default), greedy
decoding or sampling, behind one `decode(model, source_ids, options)`.

Every method returns n-best lists with comparable scores, log P(Y|X) / lp(Y)
with GNMT's lp(Y) = ((5 + |Y|) / 6)^alpha: beam search keeps `beam_size`
hypotheses, sampling draws `num_samples` and sorts them, greedy gives one.
"""

import dataclasses
from typing import Optional

import tensorflow as tf

from tf_transformer.config import DecodingConfig
from tf_transformer.decoding import limits as limits_lib
from tf_transformer.decoding import prefix as prefix_lib
from tf_transformer.decoding.beam_search import beam_search
from tf_transformer.decoding.beam_search import length_penalty
from tf_transformer.decoding.beam_search import tile_beams
from tf_transformer.decoding.ensemble import step_of
from tf_transformer.decoding.greedy import greedy_search
from tf_transformer.decoding.greedy import sample_search
from tf_transformer.decoding import step as step_lib
from tf_transformer.special_ids import EOS_ID, PAD_ID

METHODS = ("beam", "greedy", "sample")
# Source lengths are padded to multiples of this under XLA (one compiled
# search per multiple and batch size, not one per request).
LENGTH_BUCKET = 16
_OLD_NAMES = {"alpha": "length_penalty_alpha",
              "max_length_offset": "max_decode_length_offset"}


@dataclasses.dataclass(frozen=True)
class DecodingOptions(DecodingConfig):
  """How to decode: a config's decoding part (beam_size,
  length_penalty_alpha, max_decode_length_offset; the paper's 4, 0.6, +50,
  section 6.1; the parsing preset's 21, 0.3, +300, section 6.3) and the
  choices of one decoding: the method, and sampling's settings."""
  method: str = "beam"
  temperature: float = 1.0
  top_k: int = 0
  num_samples: int = 1
  seed: Optional[int] = None

  def __post_init__(self):
    super().__post_init__()
    if self.method not in METHODS:
      raise ValueError(f"method={self.method!r}: one of {METHODS}")
    limits_lib.check_sampling(self.temperature, self.top_k)
    if self.num_samples < 1:
      raise ValueError(f"num_samples={self.num_samples}: must be >= 1")

  @classmethod
  def from_config(cls, config, **overrides):
    """The config's decoding part, then `overrides` that are not None."""
    values = dataclasses.asdict(config.decoding)
    values.update({k: v for k, v in overrides.items() if v is not None})
    return cls(**values)

  @classmethod
  def from_dict(cls, values):
    """Options saved with `dataclasses.asdict`, also under the names exports
    written before the options shared the config's (alpha,
    max_length_offset)."""
    values = dict(values)
    for old, new in _OLD_NAMES.items():
      if old in values:
        values[new] = values.pop(old)
    return cls(**values)

  @property
  def nbest(self) -> int:
    """Hypotheses returned per sentence."""
    return {"beam": self.beam_size, "greedy": 1,
            "sample": self.num_samples}[self.method]


def decode(model, source_ids, options=DecodingOptions(), max_length=None,
           step_weights=None, prefix=None):
  """(ids [batch, nbest, length], scores [batch, nbest]), best first, for
  `source_ids` [batch, source_length] (EOS-terminated, PAD-padded).
  `max_length` (at least every sentence's limit) fixes the buffers' length,
  a static shape for XLA; the ids then have `max_length` columns.
  `step_weights`: the decoding step's weights (`step.Step.prepare`, an
  export's stored copy; by default prepared from the model at each
  call). `prefix`: a `prefix.Prefix` of
  target tokens each output starts with (`decoding/prefix.py`)."""
  if options.method == "beam":
    return model_beam_search(model, source_ids, options.beam_size,
                             options.length_penalty_alpha,
                             options.max_decode_length_offset, max_length,
                             step_weights, prefix)
  n = options.nbest
  batch = tf.shape(source_ids)[0]
  if options.method == "greedy":
    ids, log_probs = greedy_search(
        model, source_ids, options.max_decode_length_offset, max_length,
        step_weights, prefix)
  else:
    ids, log_probs = sample_search(
        model, tile_beams(source_ids, n), options.temperature, options.top_k,
        options.max_decode_length_offset, options.seed, max_length,
        step_weights, prefix and prefix_lib.Prefix(
            *[tile_beams(x, n) for x in prefix]))
  lengths = _lengths(ids)
  penalty = length_penalty(lengths, options.length_penalty_alpha)
  scores = tf.reshape(log_probs / penalty, [batch, n])
  ids = tf.reshape(ids, [batch, n, -1])
  scores, order = tf.math.top_k(scores, k=n)
  return tf.gather(ids, order, batch_dims=1), scores


def fixed_shape_decode(model, source_ids, options=DecodingOptions(),
                       step_weights=None):
  """`decode` with every buffer sized by `source_ids`' shape alone (its
  length + the offset), never by its values: compiled with XLA, one program
  serves every batch of that shape. The ids have that many columns."""
  max_length = tf.shape(source_ids)[1] + options.max_decode_length_offset
  return decode(model, source_ids, options, max_length, step_weights)


def decode_in_buckets(compiled_decode, source_ids, options=DecodingOptions(),
                      length_multiple=LENGTH_BUCKET):
  """`compiled_decode` (a `fixed_shape_decode` compiled with XLA) of
  `source_ids` padded to a bucket: rows to the next power of 2 (with
  one-token sentences), columns to the next multiple of `length_multiple`,
  so a server compiles a few programs once instead of one per request.
  Returns what `decode` returns for `source_ids`, PAD-padded to the
  batch's longest limit."""
  batch, length = tf.shape(source_ids)[0], tf.shape(source_ids)[1]
  rows = _next_power_of_2(tf.maximum(batch, 1))
  columns = (length + length_multiple - 1) // length_multiple * length_multiple
  padded = tf.pad(source_ids, [[0, rows - batch], [0, columns - length]],
                  constant_values=PAD_ID)
  # Filler rows are one-token sentences (EOS): all-PAD ones attend nowhere.
  filler = tf.range(rows)[:, tf.newaxis] >= batch
  padded = tf.where(filler & (tf.range(columns) == 0), EOS_ID, padded)
  ids, scores = compiled_decode(padded)
  lengths = _lengths(source_ids)
  # (an empty batch's maximum is the lowest int32: its limit is 1)
  limit = tf.maximum(
      tf.reduce_max(lengths) + options.max_decode_length_offset, 1)
  return ids[:batch, :, :limit], scores[:batch]


def _lengths(ids):
  """[rows] int32: the tokens of each row of PAD-padded `ids` [rows,
  length], EOS included."""
  return tf.reduce_sum(tf.cast(ids != PAD_ID, tf.int32), 1)


def _next_power_of_2(n):
  """The smallest power of 2 >= n (int32 n >= 1): n - 1 with every bit
  below its highest set, plus 1."""
  n -= 1
  for shift in (1, 2, 4, 8, 16):
    n = tf.bitwise.bitwise_or(n, tf.bitwise.right_shift(n, shift))
  return n + 1


def decode_in_parts(model, source_ids, options=DecodingOptions(), parts=2,
                    step_weights=None):
  """`decode`, with the batch sorted by source length and dealt into `parts`
  slices round-robin (sentences 0, N, 2N... of the sorted batch to the
  first, 1, N+1... to the second), decoded by independent loops, which
  TensorFlow's executor runs at the same time on its inter-op threads; the
  results come back in the input's order. Dealt rather than cut into
  contiguous runs, every part holds short and long sentences alike, so the
  loops end together instead of the short part's core idling while the long
  one decodes (1,000 Multi30k captions at batch 32: 1.08x). On a CPU
  whose ops are too small to keep several intra-op threads busy (a decoder
  step at serving batch sizes), this uses the cores: with
  --tensorflow_intra_op_parallelism=1 and one inter-op thread a part, 2
  parts decode Multi30k 1.3x faster on 2 cores than 1."""
  if parts == 1:
    return decode(model, source_ids, options, step_weights=step_weights)
  lengths = _lengths(source_ids)
  order = tf.argsort(lengths, stable=True)
  # The input rows of each part, in the order their results are concatenated.
  dealt = [order[part::parts] for part in range(parts)]
  results = []
  for part_rows in dealt:
    part_ids = tf.gather(source_ids, part_rows)
    # Each part cut to its own longest source.
    part_ids = part_ids[:, :tf.reduce_max(tf.gather(lengths, part_rows))]
    # A batch smaller than `parts` leaves parts empty: no search for them.
    results.append(tf.cond(
        tf.size(part_ids) > 0,
        lambda part_ids=part_ids: decode(model, part_ids, options,
                                         step_weights=step_weights),
        lambda: (tf.zeros([0, options.nbest, 1], tf.int32),
                 tf.zeros([0, options.nbest]))))
  longest = tf.reduce_max([tf.shape(ids)[2] for ids, _ in results])
  ids = tf.concat([tf.pad(ids, [[0, 0], [0, 0], [0, longest - tf.shape(ids)[2]]])
                   for ids, _ in results], 0)
  scores = tf.concat([scores for _, scores in results], 0)
  inverse = tf.math.invert_permutation(tf.concat(dealt, 0))
  return tf.gather(ids, inverse), tf.gather(scores, inverse)


def model_beam_search(model, source_ids, beam_size=4, alpha=0.6,
                      max_length_offset=50, max_length=None,
                      step_weights=None, prefix=None):
  """(ids [batch, beam, length], scores [batch, beam]) for `source_ids`
  [batch, source_length] (EOS-terminated, PAD-padded). Each output has at
  most its source length + `max_length_offset` tokens; `max_length` fixes
  the buffers' length (a static shape, for XLA), else it is the longest
  limit of the batch. With `max_length` every shape stays static (no
  sentence leaves the batch), as XLA needs."""
  compact = max_length is None
  decoder = step_of(model, static=not compact)
  batch_size = tf.shape(source_ids)[0]
  memory, source_mask = decoder.encode(source_ids)
  limits, max_length = limits_lib.output_limits(source_mask,
                                                max_length_offset, max_length)
  weights = step_lib.read(decoder, step_weights, max_length)
  # The beams share their sentence's memory; only `ancestors` is reordered.
  # The source mask rides in the search's cache, so that it follows the
  # sentences still searching.
  cache = {"decoder": decoder.initial_cache(weights, memory, max_length,
                                            group_size=beam_size),
           "source_mask": source_mask}
  if prefix is not None:  # per sentence, as the source mask
    cache["prefix"] = prefix

  def symbols_to_logits(ids, step, cache):
    logits, decoder_cache = decoder(ids, step, cache["decoder"],
                                    cache["source_mask"], weights)
    if prefix is not None:
      logits = prefix_lib.force(logits, step, cache["prefix"], beam_size)
    return logits, dict(cache, decoder=decoder_cache)

  def reorder_cache(cache, parents):
    return dict(cache, decoder=decoder.reorder(cache["decoder"], parents))

  def select_cache(cache, sentences):
    selected = {"decoder": decoder.select(cache["decoder"], sentences),
                "source_mask": tf.gather(cache["source_mask"], sentences)}
    if prefix is not None:
      selected["prefix"] = prefix_lib.select(cache["prefix"], sentences)
    return selected

  return beam_search(
      symbols_to_logits, cache, batch_size, limits, max_length, beam_size,
      alpha, reorder_cache=reorder_cache,
      select_cache=select_cache if compact else None,
      cache_batch_axes=dict(
          {"decoder": decoder.sentence_axes(cache["decoder"]),
           "source_mask": 0},
          **({} if prefix is None else {"prefix": prefix_lib.Prefix(0, 0)}))
      if compact else None)
