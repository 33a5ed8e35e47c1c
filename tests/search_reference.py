"""A reference for comparing two searches over one model: beam search and
greedy decoding in NumPy over the model's teacher-forced log-probabilities
(float64 from its float32 logits), by the rules of our search
(decoding/beam_search.py, decoding/greedy.py) or of CTranslate2's (its
decoding.cc, called as translators/ct2_runtime.py calls it), recording how near
each decision came to going the other way.

Why a line may differ between two implementations of one search: per token,
each engine's log-probability is within EPSILON of this reference's, half
of what float32_bounds.LOG_PROB allows two paths (measured on the suite's
numbers models: our cached step within 8e-7, CTranslate2 within 6e-6, the
export's graph within 1.8e-5, with logits up to about 10). A decision between
hypotheses of t tokens compares sums of t such values, which each engine may
shift by t * EPSILON; a decision between two tokens after one prefix (greedy)
compares single values. So where a decision's margin (the gap between what
was chosen and what was not) is below 2 * t * EPSILON, float32 rounding can
tip it, and the two searches may go apart from there on (beam search is not
monotone: what follows can differ by any amount). `Result.near_tie` says
whether any decision of a line's search was that close. A line that differs
between two implementations of the same rules without one is a bug.
"""

import dataclasses
import functools
import math

import numpy as np
import tensorflow as tf

from tf_transformer.special_ids import BOS_ID, EOS_ID, NEVER_OUTPUT, PAD_ID
from float32_bounds import LOG_PROB

EPSILON = LOG_PROB / 2
RULES = ("ours", "ctranslate2")
CT2_PATIENCE = 2  # serving/ct2_runtime.PATIENCE


def gnmt_penalty(length, alpha):
  return ((5.0 + length) / 6.0) ** alpha


@dataclasses.dataclass
class Result:
  tokens: tuple  # the best output's ids, its EOS left out
  score: float  # log P(Y|X) / GNMT's lp(|Y|), |Y| counting the EOS if any
  near_tie: bool  # a decision was within float32 rounding (module docstring)
  margin: float  # the smallest margin / (2 * t) of its decisions


class _Search:
  """One sentence's search, advanced a step at a time by `advance`."""

  def __init__(self, rules, beam_size, alpha, limit, prefix=()):
    self.rules, self.k, self.alpha, self.limit = rules, beam_size, alpha, limit
    self.prefix = tuple(prefix)  # forced first tokens (decoding/prefix.py)
    self.alive = [((), 0.0)]  # (tokens, log P)
    self.finished = []  # (tokens with their EOS, log P, score)
    self.count = 0  # ours: finished among the top k candidates
    self.t = 0  # the live hypotheses' length
    self.done = False
    self.margin = math.inf

  def _note(self, gap, tokens):
    self.margin = min(self.margin, abs(gap) / (2 * max(tokens, 1)))

  def _ends(self, token, t):
    return token == EOS_ID or t >= self.limit

  def _finish(self, tokens, log_prob):
    self.finished.append((tokens, log_prob,
                          log_prob / gnmt_penalty(len(tokens), self.alpha)))

  def candidates(self, log_probs):
    """(log P, live slot, token) of the best 2k continuations, best first;
    notes the margins between neighbours among the best 2k + 1."""
    totals = log_probs + np.array([p for _, p in self.alive])[:, None]
    if self.rules == "ours":
      totals[:, list(NEVER_OUTPUT)] = -np.inf
    if self.t < len(self.prefix):  # only the forced token, as the model
      forced = totals[:, self.prefix[self.t]].copy()  # scores it
      totals[:] = -np.inf
      totals[:, self.prefix[self.t]] = forced
    flat = totals.ravel()
    order = np.argsort(-flat, kind="stable")[:2 * self.k + 1]
    ranked = [(flat[i], i // totals.shape[1], i % totals.shape[1])
              for i in order if np.isfinite(flat[i])]
    if self.k == 1:  # greedy: two tokens after one prefix
      if len(ranked) > 1:
        self._note(ranked[0][0] - ranked[1][0], 1)
    else:
      for a, b in zip(ranked, ranked[1:]):
        self._note(a[0] - b[0], self.t + 1)
    return ranked[:2 * self.k]

  def advance(self, log_probs):
    """One step from the live hypotheses' next-token log-probabilities
    [live, vocab]."""
    t = self.t + 1  # the candidates' length
    ranked = self.candidates(log_probs)
    grow = lambda slot, token: self.alive[slot][0] + (int(token),)
    if self.k == 1:  # greedy: the best token (of those allowed)
      log_prob, slot, token = ranked[0]
      self.alive = [(grow(slot, token), log_prob)]
      if self._ends(token, t):
        self._finish(*self.alive[0])
    elif self.rules == "ours":
      self._advance_ours(ranked, grow, t)
    else:
      self._advance_ct2(ranked, grow, t)
    self.t = t
    self.done = self.done or bool(self.finished and self.k == 1) or (
        t >= self.limit)

  def _advance_ours(self, ranked, grow, t):
    """Every ending candidate of the 2k finishes; the best k others live on;
    the three stopping rules of decoding/beam_search.py."""
    k = self.k
    for rank, (log_prob, slot, token) in enumerate(ranked):
      if self._ends(token, t):
        self._finish(grow(slot, token), log_prob)
        self.count += rank < k
    self.alive = [(grow(slot, token), log_prob)
                  for log_prob, slot, token in ranked
                  if not self._ends(token, t)][:k]
    self.finished = sorted(self.finished, key=lambda f: -f[2])
    if len(self.finished) > k:  # which k stay
      self._note(self.finished[k - 1][2] - self.finished[k][2], t)
    self.finished = self.finished[:k]
    scores = [f[2] for f in self.finished]
    best_alive = self.alive[0][1] if self.alive else -math.inf
    worst_finished = scores[k - 1] if len(scores) >= k else -math.inf
    reach = best_alive / gnmt_penalty(self.limit, self.alpha)
    if math.isfinite(worst_finished) and math.isfinite(best_alive):
      self._note(worst_finished - reach, t)
    hopeless = worst_finished >= reach
    enough = False
    if self.count >= k and math.isfinite(best_alive):
      now = best_alive / gnmt_penalty(t, self.alpha)
      self._note(scores[0] - now, t)
      enough = scores[0] >= now
    self.done = enough or hopeless or not self.alive

  def _advance_ct2(self, ranked, grow, t):
    """An ending candidate among the best k finishes, and the next non-EOS
    candidate of ranks k + 1 to 2k takes its place; done once k * patience
    have finished."""
    k = self.k
    alive, secondary = [], k
    for log_prob, slot, token in ranked[:k]:
      if self._ends(token, t):
        self._finish(grow(slot, token), log_prob)
        for j in range(secondary, len(ranked)):
          if ranked[j][2] != EOS_ID:
            log_prob, slot, token = ranked[j]
            secondary = j + 1
            break
      alive.append((grow(slot, token), log_prob))
    self.alive = alive
    self.done = len(self.finished) >= round(k * CT2_PATIENCE)

  def result(self):
    if self.rules == "ctranslate2" and self.k > 1:
      # It returns its best k * patience by log P / |Y|^alpha, which
      # ct2_runtime re-ranks by GNMT's penalty.
      by_its_own = sorted(self.finished, key=lambda f: -f[1] / len(f[0])
                          ** self.alpha)
      kept = round(self.k * CT2_PATIENCE)
      if len(by_its_own) > kept:
        own = lambda f: f[1] / len(f[0]) ** self.alpha
        self._note(own(by_its_own[kept - 1]) - own(by_its_own[kept]),
                   self.limit)
      candidates = by_its_own[:kept]
    else:
      candidates = self.finished
    ranked = sorted(candidates, key=lambda f: -f[2])
    for a, b in zip(ranked, ranked[1:]):  # the n-best's order
      self._note(a[2] - b[2], max(len(a[0]), len(b[0])))
    tokens, _, score = ranked[0]
    tokens = tokens[:-1] if tokens[-1:] == (EOS_ID,) else tokens
    margin = self.margin
    return Result(tuple(int(t) for t in tokens), float(score),
                  margin < EPSILON, margin)


@functools.lru_cache(maxsize=8)
def _teacher_forced(model):
  """`model`'s teacher-forced logits as one graph for every shape: a
  search's steps call it with new shapes, which Keras' eager calls ran
  about 3x as slowly."""
  ids = tf.TensorSpec([None, None], tf.int32)
  return tf.function(lambda source, target: model((source, target),
                                                  training=False),
                     input_signature=[ids, ids], autograph=False)


def next_log_probs(model, sources, prefixes):
  """float64 [rows, vocab]: log P(next token | prefix, source), teacher
  forced through `model` (its float32 logits)."""
  source = np.full((len(sources), max(len(s) for s in sources)), PAD_ID,
                   np.int32)
  target = np.full((len(prefixes), max(len(p) for p in prefixes) + 1), PAD_ID,
                   np.int32)
  for row, (ids, prefix) in enumerate(zip(sources, prefixes)):
    source[row, :len(ids)] = ids
    target[row, :len(prefix) + 1] = (BOS_ID,) + tuple(prefix)
  logits = _teacher_forced(model)(tf.constant(source), tf.constant(target))
  last = tf.gather(logits, [len(p) for p in prefixes], batch_dims=1).numpy()
  last = last.astype(np.float64)
  top = last.max(-1, keepdims=True)
  return last - (top + np.log(np.sum(np.exp(last - top), -1,
                                     keepdims=True)))


def search(model, sources, rules="ours", beam_size=4, alpha=0.6,
           max_length_offset=50, known=None, prefixes=None):
  """[Result] of each source (ids ending in EOS), by `rules` ("ours" or
  "ctranslate2"); `beam_size` 1 is greedy decoding. Each output has at most
  its source's length + `max_length_offset` tokens, EOS included. `known`:
  a dict of log-probabilities already computed ((source index, prefix) ->
  [vocab]), shared by searches of the same model and sources, filled in.
  `prefixes`: each output's forced first tokens (ours), or None."""
  if rules not in RULES:
    raise ValueError(f"rules={rules!r}: one of {RULES}")
  known = {} if known is None else known
  prefixes = prefixes or [()] * len(sources)
  searches = [_Search(rules, beam_size, alpha, len(s) + max_length_offset, p)
              for s, p in zip(sources, prefixes)]
  while True:
    active = [(i, s) for i, s in enumerate(searches) if not s.done]
    if not active:
      return [s.result() for s in searches]
    rows = [(i, tokens) for i, s in active for tokens, _ in s.alive]
    missing = list(dict.fromkeys(r for r in rows if r not in known))
    if missing:
      for row, values in zip(missing, next_log_probs(
          model, [sources[i] for i, _ in missing],
          [tokens for _, tokens in missing])):
        known[row] = values
    for i, s in active:
      s.advance(np.stack([known[(i, tokens)] for tokens, _ in s.alive]))


def assert_near_ties(model, sources, lines, beam_size=4, alpha=0.6,
                     max_length_offset=50, why=lambda line: "",
                     epsilon=lambda line: EPSILON, prefixes=None):
  """Asserts that the reference search by our rules meets a near-tie on each
  of `lines` (indices into `sources`): a decision whose margin is within
  `epsilon(line)` per token (float32 rounding by default), the only cause
  two implementations of one search can differ by there (module
  docstring)."""
  if not lines:
    return
  results = search(model, [sources[line] for line in lines], "ours",
                   beam_size, alpha, max_length_offset,
                   prefixes=prefixes and [prefixes[line] for line in lines])
  for line, result in zip(lines, results):
    assert result.margin < epsilon(line), (
        f"line {line} differs with no decision within {epsilon(line):.2g} "
        f"a token: {why(line)} (reference: {result})")


def rounding_between(model, other, source, hypotheses):
  """The largest |log P_other - log P_model| of any token after any prefix
  of `hypotheses` (id lists, EOS left out) given `source`: how far `other`'s
  rounding (a bfloat16 copy of `model`) moves what two searches weighed
  along those paths."""
  prefixes = list(dict.fromkeys(tuple(h[:t]) for h in hypotheses
                                for t in range(len(h) + 1)))
  sources = [source] * len(prefixes)
  return float(np.max(np.abs(
      next_log_probs(model, sources, prefixes)
      - next_log_probs(other, sources, prefixes))))


def lines_apart(model, sources, first, second, beam_size=4, alpha=0.6,
                max_length_offset=50, prefixes=None):
  """The lines where two runs of our search over `model` (each line's
  n-best outputs, as lists of ids) differ, each asserted to be a near-tie
  (`assert_near_ties`)."""
  strip = lambda ids: tuple(int(t) for t in ids if t != PAD_ID)
  apart = [line for line, (a, b) in enumerate(zip(first, second))
           if [strip(x) for x in a] != [strip(x) for x in b]]
  assert_near_ties(model, sources, apart, beam_size, alpha,
                   max_length_offset,
                   lambda line: f"{first[line]} against {second[line]}",
                   prefixes=prefixes)
  return apart
