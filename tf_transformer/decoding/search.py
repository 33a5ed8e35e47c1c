"""Decoding a `Transformer` or an `Ensemble`: beam search (section 6.1, the
default), greedy decoding or sampling, through one entry,

    ids, scores = decode(model, source_ids, DecodingOptions(...),
                         prefix=None, step_weights=None)

whatever the request: n-best lists, a target prefix (`decoding/prefix.py`),
the batch dealt into independent searches (`parts`), or compiled by XLA on
padded shapes (`xla`).

Every method returns n-best lists with comparable scores, log P(Y|X) / lp(Y)
with GNMT's lp(Y) = ((5 + |Y|) / 6)^alpha: beam search keeps `beam_size`
hypotheses, sampling draws `num_samples` and sorts them, greedy gives one.
"""

import collections
import dataclasses
from typing import Optional

import tensorflow as tf

from tf_transformer.config import DecodingConfig
from tf_transformer.decoding import bans as bans_lib
from tf_transformer.decoding import limits as limits_lib
from tf_transformer.decoding import prefix as prefix_lib
from tf_transformer.decoding import shortlist as shortlist_lib
from tf_transformer.decoding.beam_search import beam_search
from tf_transformer.decoding.beam_search import length_penalty
from tf_transformer.decoding.beam_search import tile_beams
from tf_transformer.decoding.ensemble import step_of
from tf_transformer.decoding.greedy import greedy_search
from tf_transformer.decoding.greedy import sample_search
from tf_transformer.decoding import step as step_lib
from tf_transformer.layers import masks
from tf_transformer import special_ids
from tf_transformer.choices import METHODS
from tf_transformer.choices import DECODING_BOUNDS
from tf_transformer.choices import check_decoding
from tf_transformer.choices import XLA_WITH_SHORTLIST
from tf_transformer.special_ids import EOS_ID, PAD_ID

# Source and prefix lengths are padded to multiples of this under XLA (one
# compiled search per multiple and batch size, not one per request).
LENGTH_BUCKET = 16


@dataclasses.dataclass(frozen=True)
class DecodingOptions(DecodingConfig):
  """How to decode: a config's decoding part (beam_size,
  length_penalty_alpha, max_decode_length_offset; the paper's 4, 0.6, +50,
  section 6.1; the parsing preset's 21, 0.3, +300, section 6.3) and the
  choices of one decoding: the method, sampling's settings, the tokens
  banned at a step (`min_length`, `no_repeat_ngram_size`: `bans.py`), and
  how it runs: `parts` independent searches over the batch (`_in_parts`),
  or compiled by XLA (`xla`, `_in_buckets`); the same outputs either way."""
  method: str = "beam"
  temperature: float = 1.0
  top_k: int = 0
  top_p: float = 1.0
  num_samples: int = 1
  seed: Optional[int] = None
  parts: int = 1
  xla: bool = False
  min_length: int = 0
  no_repeat_ngram_size: int = 0

  def __post_init__(self):
    super().__post_init__()
    if self.method not in METHODS:
      raise ValueError(f"method={self.method!r}: one of {METHODS}")
    check_decoding(**{name: getattr(self, name) for name in DECODING_BOUNDS})
    if self.parts < 1:
      raise ValueError(f"parts={self.parts}: must be >= 1")
    if self.xla and self.parts > 1:
      raise ValueError(f"parts={self.parts} with xla=True: the parts' "
                       "shapes depend on the lengths, which XLA would "
                       "compile anew for every request")

  @classmethod
  def from_config(cls, config, **overrides):
    """The config's decoding part, then `overrides` that are not None."""
    values = dataclasses.asdict(config.decoding)
    values.update({k: v for k, v in overrides.items() if v is not None})
    return cls(**values)

  @property
  def bans(self) -> bans_lib.Bans:
    """The tokens banned at a step (`decoding/bans.py`)."""
    return bans_lib.Bans(self.min_length, self.no_repeat_ngram_size)

  @property
  def nbest(self) -> int:
    """Hypotheses returned per sentence."""
    return {"beam": self.beam_size, "greedy": 1,
            "sample": self.num_samples}[self.method]


def refuse_xla_with_shortlist(xla, shortlist):
  """Raises ValueError(`XLA_WITH_SHORTLIST`) where both are asked for.

  Args:
    xla: whether the search is compiled with XLA.
    shortlist: whether a vocabulary shortlist is given.
  """
  if xla and shortlist:
    raise ValueError(XLA_WITH_SHORTLIST)


def decode(model, source_ids, options=DecodingOptions(), *, prefix=None,
           step_weights=None, shortlist=None):
  """The one search entry.

  Args:
    model: a `Transformer` or an `Ensemble`.
    source_ids: [batch, source_length] int32, EOS-terminated, PAD-padded.
    options: `DecodingOptions`.
    prefix: a `prefix.Prefix` of target tokens each output starts with.
    step_weights: the decoding step's weights (`step.Step.prepare`, an
      export's stored copy); by default prepared from the model at each
      call.
    shortlist: a `shortlist.Shortlist`: each search (each part's, with
      `parts`) decodes over its sources' shortlist, scores normalized there.
      Not with `xla` (its size varies by request).
  Returns:
    (ids [batch, nbest, length], scores [batch, nbest]), best first, PAD
    after each output.
  """
  refuse_xla_with_shortlist(options.xla, shortlist is not None)
  if options.xla:
    return _in_buckets(model, source_ids, options, prefix, step_weights)
  if options.parts > 1:
    return _in_parts(model, source_ids, options, prefix, step_weights,
                     shortlist)
  return _search(model, source_ids, options, prefix, step_weights,
                 shortlist=shortlist)


def _search(model, source_ids, options, prefix=None, step_weights=None,
            max_length=None, shortlist=None):
  """`decode` in one loop. `max_length` (at least every sentence's limit)
  fixes the buffers' length and makes every shape static, as XLA needs;
  the ids then have `max_length` columns."""
  if shortlist is not None:
    vocab = shortlist_lib.vocabulary(shortlist, source_ids, prefix)
    weights = step_lib.read(step_of(model), step_weights, tf.shape(
        source_ids)[1] + options.max_decode_length_offset)
    ids, scores = _search(
        model, source_ids, options,
        prefix and shortlist_lib.to_shortlist(prefix, vocab),
        shortlist_lib.restrict(weights, vocab), max_length)
    return tf.gather(vocab, ids), scores
  if options.method == "beam":
    return _beam(model, source_ids, options, max_length, step_weights, prefix)
  n = options.nbest
  batch = tf.shape(source_ids)[0]
  if options.method == "greedy":
    ids, log_probs = greedy_search(
        model, source_ids, options.max_decode_length_offset, max_length,
        step_weights, prefix, bans=options.bans)
  else:
    ids, log_probs = sample_search(
        model, tile_beams(source_ids, n), options.temperature, options.top_k,
        options.max_decode_length_offset, options.seed, max_length,
        step_weights, prefix and prefix_lib.Prefix(
            *[tile_beams(x, n) for x in prefix]), top_p=options.top_p,
        bans=options.bans)
  lengths = _lengths(ids)
  penalty = length_penalty(lengths, options.length_penalty_alpha)
  scores = tf.reshape(log_probs / penalty, [batch, n])
  ids = tf.reshape(ids, [batch, n, -1])
  scores, order = tf.math.top_k(scores, k=n)
  return tf.gather(ids, order, batch_dims=1), scores


# The compiled searches last used: (model, options, step weights, with a
# prefix) -> the search. A server's module keeps one model and options, so
# it compiles once per shape; a few entries bound what a process that
# decodes many models keeps.
_COMPILED = collections.OrderedDict()
_COMPILED_KEPT = 8


def _compiled_search(model, options, step_weights, with_prefix):
  """The search under XLA with every buffer sized by the inputs' shapes
  alone (the source length + the offset), never by their values: one
  program serves every batch of a shape."""
  key = (id(model), options, id(step_weights), with_prefix)
  found = _COMPILED.get(key)
  if found is None or found[0] is not model or found[1] is not step_weights:

    def search(source_ids, *prefix):
      max_length = (tf.shape(source_ids)[1]
                    + options.max_decode_length_offset)
      return _search(model, source_ids, options,
                     prefix_lib.Prefix(*prefix) if prefix else None,
                     step_weights, max_length)
    found = (model, step_weights,
             tf.function(search, jit_compile=True, autograph=False))
    _COMPILED[key] = found
    while len(_COMPILED) > _COMPILED_KEPT:
      _COMPILED.popitem(last=False)
  _COMPILED.move_to_end(key)
  return found[2]


def _in_buckets(model, source_ids, options, prefix, step_weights):
  """`decode` compiled by XLA on `source_ids` (and `prefix`) padded to a
  bucket: rows to the next power of 2 (with one-token sentences), columns
  to the next multiple of LENGTH_BUCKET, so that a server compiles a few
  programs once instead of one per request. Returns what `decode` returns
  for `source_ids`, PAD-padded to the batch's longest limit."""
  batch, length = tf.shape(source_ids)[0], tf.shape(source_ids)[1]
  rows = _next_power_of_2(tf.maximum(batch, 1))
  padded = tf.pad(source_ids, [[0, rows - batch],
                               [0, _bucket(length) - length]],
                  constant_values=PAD_ID)
  # Filler rows are one-token sentences (EOS): all-PAD ones attend nowhere.
  filler = tf.range(rows)[:, tf.newaxis] >= batch
  padded = tf.where(filler & (tf.range(tf.shape(padded)[1]) == 0), EOS_ID,
                    padded)
  arguments = [padded]
  if prefix is not None:  # filler rows and columns: no prefix there
    width = tf.shape(prefix.ids)[1]
    arguments += [tf.pad(prefix.ids, [[0, rows - batch],
                                      [0, _bucket(width) - width]]),
                  tf.pad(prefix.lengths, [[0, rows - batch]])]
  ids, scores = _compiled_search(model, options, step_weights,
                                 prefix is not None)(*arguments)
  # (an empty batch's maximum is the lowest int32: its limit is 1)
  limit = tf.maximum(
      tf.reduce_max(_lengths(source_ids)) + options.max_decode_length_offset,
      1)
  return ids[:batch, :, :limit], scores[:batch]


def _bucket(length):
  """The next multiple of LENGTH_BUCKET, at least one."""
  return tf.maximum((length + LENGTH_BUCKET - 1) // LENGTH_BUCKET, 1) * (
      LENGTH_BUCKET)


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


def _in_parts(model, source_ids, options, prefix, step_weights,
              shortlist=None):
  """`decode`, with the batch sorted by source length and dealt into
  `options.parts` slices round-robin (sentences 0, N, 2N... of the sorted
  batch to the first, 1, N+1... to the second), decoded by independent
  loops, which TensorFlow's executor runs at the same time on its inter-op
  threads; the results come back in the input's order. Dealt rather than
  cut into contiguous runs, every part holds short and long sentences
  alike, so the loops end together instead of one part's core idling while
  another decodes. Where a step's ops are too small to keep several
  intra-op threads busy (a decoder step at serving batch sizes), this uses
  the cores: with --tensorflow_intra_op_parallelism=1 and one inter-op
  thread a part (docs/performance.md)."""
  parts = options.parts
  lengths = _lengths(source_ids)
  order = tf.argsort(lengths, stable=True)
  # The input rows of each part, in the order their results are concatenated.
  dealt = [order[part::parts] for part in range(parts)]
  results = []
  for part_rows in dealt:
    part_ids = tf.gather(source_ids, part_rows)
    # Each part cut to its own longest source.
    part_ids = part_ids[:, :tf.reduce_max(tf.gather(lengths, part_rows))]
    part_prefix = prefix and prefix_lib.select(prefix, part_rows)
    # A batch smaller than `parts` leaves parts empty: no search for them.
    results.append(tf.cond(
        tf.size(part_ids) > 0,
        lambda ids=part_ids, forced=part_prefix: _search(
            model, ids, options, forced, step_weights, shortlist=shortlist),
        lambda: (tf.zeros([0, options.nbest, 1], tf.int32),
                 tf.zeros([0, options.nbest]))))
  longest = tf.reduce_max([tf.shape(ids)[2] for ids, _ in results])
  ids = tf.concat([tf.pad(ids, [[0, 0], [0, 0], [0, longest - tf.shape(ids)[2]]])
                   for ids, _ in results], 0)
  scores = tf.concat([scores for _, scores in results], 0)
  inverse = tf.math.invert_permutation(tf.concat(dealt, 0))
  return tf.gather(ids, inverse), tf.gather(scores, inverse)


def _beam(model, source_ids, options, max_length=None, step_weights=None,
          prefix=None):
  """(ids [batch, beam, length], scores [batch, beam]) of beam search
  (`beam_search.py`) for `source_ids` [batch, source_length]
  (EOS-terminated, PAD-padded). Each output has at most its source length +
  `options.max_decode_length_offset` tokens; `max_length` fixes the
  buffers' length (a static shape, for XLA), else it is the longest limit
  of the batch. With `max_length` every shape stays static (no sentence
  leaves the batch), as XLA needs."""
  beam_size = options.beam_size
  compact = max_length is None
  decoder = step_of(model, static=not compact)
  batch_size = tf.shape(source_ids)[0]
  # (The limits need only the mask; the encoder, the step's weights.)
  source_mask = masks.padding_mask(source_ids)
  limits, max_length = limits_lib.output_limits(
      source_mask, options.max_decode_length_offset, max_length)
  weights = step_lib.read(decoder, step_weights, max_length)
  memory, source_mask = decoder.encode(source_ids, weights)
  # The beams share their sentence's memory; only `ancestors` is reordered.
  # The source mask rides in the search's cache, so that it follows the
  # sentences still searching.
  cache = {"decoder": decoder.initial_cache(weights, memory, max_length,
                                            group_size=beam_size),
           "source_mask": source_mask}
  if prefix is not None:  # per sentence, as the source mask
    cache["prefix"] = prefix
  bans = options.bans
  if bans.need_history:  # [batch, beam, max_length], as the hypotheses
    cache["history"] = tf.fill([batch_size, beam_size, max_length], PAD_ID)

  def symbols_to_logits(ids, step, cache):
    logits, decoder_cache = decoder(ids, step, cache["decoder"],
                                    cache["source_mask"], weights)
    cache = dict(cache, decoder=decoder_cache)
    if prefix is not None:
      logits = prefix_lib.force(logits, step, cache["prefix"], beam_size)
    if bans.any:
      history = None
      if bans.need_history:
        cache["history"] = bans_lib.write(cache["history"], step, ids)
        history = tf.reshape(cache["history"], [-1, max_length])
      logits = bans_lib.apply(
          logits, step, bans, history, None if prefix is None else
          tf.repeat(cache["prefix"].lengths, beam_size, axis=0))
    return logits, cache

  def reorder_cache(cache, parents):
    reordered = dict(cache, decoder=decoder.reorder(cache["decoder"],
                                                    parents))
    if "history" in cache:
      reordered["history"] = tf.gather(cache["history"], parents,
                                       batch_dims=1)
    return reordered

  def select_cache(cache, sentences):
    selected = {"decoder": decoder.select(cache["decoder"], sentences),
                "source_mask": tf.gather(cache["source_mask"], sentences)}
    if prefix is not None:
      selected["prefix"] = prefix_lib.select(cache["prefix"], sentences)
    if "history" in cache:
      selected["history"] = tf.gather(cache["history"], sentences)
    return selected

  return beam_search(
      symbols_to_logits, cache, batch_size, limits, max_length, beam_size,
      options.length_penalty_alpha, reorder_cache=reorder_cache,
      select_cache=select_cache if compact else None,
      never_output=special_ids.never_output(
          decoder.config.model.decoder_start),
      cache_batch_axes=dict(
          {"decoder": decoder.sentence_axes(cache["decoder"]),
           "source_mask": 0},
          **({} if prefix is None else {"prefix": prefix_lib.Prefix(0, 0)}),
          **({"history": 0} if bans.need_history else {}))
      if compact else None)
