"""A reference for comparing two searches over one model: beam search and
greedy decoding in NumPy over the model's teacher-forced log-probabilities
(float64 from its float32 logits), by the rules of our search
(decoding/beam_search.py, decoding/greedy.py) or of CTranslate2's (its
decoding.cc, called as translators/ct2_runtime.py calls it), recording each
decision it makes: the two hypotheses it chose between, and the gap.

Why a line may differ between two implementations of one search: each
computes every hypothesis' log-probability within its rounding bound of the
exact value (tests/rounding.py, which derives the bound from the weights,
the sentence and the implementation's dtype), so a decision whose exact gap
is below the larger of the two implementations' bounds on that difference
may go either way, and the searches may go apart from there on (beam search
is not monotone: what follows can differ by any amount). This reference's
own gaps come from the float32 Keras model, within its own bound of the
exact ones. `assert_near_ties` asserts that each line that differs met such
a decision: one whose gap is within the reference's bound plus the larger
implementation's. A line that differs between two implementations of the
same rules without one is a bug.
"""

import dataclasses
import functools
import math

import numpy as np
import tensorflow as tf

from tf_transformer.special_ids import BOS_ID, EOS_ID, PAD_ID, never_output
import rounding

RULES = ("ours", "ctranslate2", "transformers")
# Hypotheses an engine finishes before it stops, a multiple of the beam:
# CTranslate2's as translators/ct2_runtime.py calls it (PATIENCE), and
# Transformers' beam search with early_stopping=True (its
# BeamSearchScorer: the same rules, done once num_beams have finished).
PATIENCE = {"ctranslate2": 2, "transformers": 1}


def gnmt_penalty(length, alpha):
  return ((5.0 + length) / 6.0) ** alpha


# The decisions of a line that `assert_near_ties` weighs, nearest first:
# enough to reach past the float32 bound of the nearest few.
DECISIONS = 16


@dataclasses.dataclass
class Result:
  tokens: tuple  # the best output's ids, its EOS left out
  score: float  # log P(Y|X) / GNMT's lp(|Y|), |Y| counting the EOS if any
  # (|gap|, hypothesis, other hypothesis) of its nearest DECISIONS
  # decisions, nearest first; each hypothesis all its ids (EOS included
  # where it ended).
  decisions: list


class _Search:
  """One sentence's search, advanced a step at a time by `advance`."""

  def __init__(self, rules, beam_size, alpha, limit, prefix=(), bans=(0, 0),
               never=never_output()):
    self.rules, self.k, self.alpha, self.limit = rules, beam_size, alpha, limit
    self.never = list(never)  # the ids the model's searches never output
    self.prefix = tuple(prefix)  # forced first tokens (decoding/prefix.py)
    # (min_length, no_repeat_ngram_size) as decoding/bans.py bans tokens:
    # a banned token's probability goes to PAD, the others' stay the model's.
    self.min_length, self.ngram = bans
    self.alive = [((), 0.0)]  # (tokens, log P)
    self.finished = []  # (tokens with their EOS, log P, score)
    self.count = 0  # ours: finished among the top k candidates
    self.t = 0  # the live hypotheses' length
    self.done = False
    self.decisions = []

  def _banned(self, tokens):
    """The ids banned after the output `tokens` (decoding/bans.py)."""
    banned = []
    if len(tokens) - len(self.prefix) < self.min_length:
      banned.append(EOS_ID)
    n = self.ngram
    if n and len(tokens) >= n - 1:
      suffix = list(tokens[len(tokens) - n + 1:])
      banned += [tokens[start + n - 1] for start in range(len(tokens) - n + 1)
                 if list(tokens[start:start + n - 1]) == suffix]
    return banned

  def _note(self, gap, first, second):
    """A decision between the hypotheses `first` and `second` (id tuples),
    whose values were `gap` apart."""
    self.decisions.append((abs(float(gap)), tuple(first), tuple(second)))

  def _ends(self, token, t):
    return token == EOS_ID or t >= self.limit

  def _finish(self, tokens, log_prob):
    self.finished.append((tokens, log_prob,
                          log_prob / gnmt_penalty(len(tokens), self.alpha)))

  def candidates(self, log_probs):
    """(log P, live slot, token) of the best 2k continuations, best first;
    notes the margins between neighbours among the best 2k + 1."""
    totals = log_probs + np.array([p for _, p in self.alive])[:, None]
    if self.rules != "ctranslate2":  # ours; Transformers' bad_words_ids
      totals[:, self.never] = -np.inf
    for row, (tokens, _) in enumerate(self.alive):
      totals[row, self._banned(tokens)] = -np.inf
    if self.t < len(self.prefix):  # only the forced token, as the model
      forced = totals[:, self.prefix[self.t]].copy()  # scores it
      totals[:] = -np.inf
      totals[:, self.prefix[self.t]] = forced
    flat = totals.ravel()
    order = np.argsort(-flat, kind="stable")[:2 * self.k + 1]
    ranked = [(flat[i], i // totals.shape[1], i % totals.shape[1])
              for i in order if np.isfinite(flat[i])]
    grown = lambda entry: self.alive[entry[1]][0] + (int(entry[2]),)
    neighbours = ranked[:2] if self.k == 1 else ranked
    for a, b in zip(neighbours, neighbours[1:]):
      self._note(a[0] - b[0], grown(a), grown(b))
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
      self._note(self.finished[k - 1][2] - self.finished[k][2],
                 self.finished[k - 1][0], self.finished[k][0])
    self.finished = self.finished[:k]
    scores = [f[2] for f in self.finished]
    best_alive = self.alive[0][1] if self.alive else -math.inf
    worst_finished = scores[k - 1] if len(scores) >= k else -math.inf
    reach = best_alive / gnmt_penalty(self.limit, self.alpha)
    if math.isfinite(worst_finished) and math.isfinite(best_alive):
      self._note(worst_finished - reach, self.finished[k - 1][0],
                 self.alive[0][0])
    hopeless = worst_finished >= reach
    enough = False
    if self.count >= k and math.isfinite(best_alive):
      now = best_alive / gnmt_penalty(t, self.alpha)
      self._note(scores[0] - now, self.finished[0][0], self.alive[0][0])
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
    self.done = len(self.finished) >= round(k * PATIENCE[self.rules])

  def result(self):
    if self.rules in PATIENCE and self.k > 1:
      # It returns its best k * patience by log P / |Y|^alpha, which
      # ct2_runtime re-ranks by GNMT's penalty.
      by_its_own = sorted(self.finished, key=lambda f: -f[1] / len(f[0])
                          ** self.alpha)
      kept = round(self.k * PATIENCE[self.rules])
      if len(by_its_own) > kept:
        own = lambda f: f[1] / len(f[0]) ** self.alpha
        self._note(own(by_its_own[kept - 1]) - own(by_its_own[kept]),
                   by_its_own[kept - 1][0], by_its_own[kept][0])
      candidates = by_its_own[:kept]
    else:
      candidates = self.finished
    ranked = sorted(candidates, key=lambda f: -f[2])
    for a, b in zip(ranked, ranked[1:]):  # the n-best's order
      self._note(a[2] - b[2], a[0], b[0])
    tokens, _, score = ranked[0]
    tokens = tokens[:-1] if tokens[-1:] == (EOS_ID,) else tokens
    nearest = sorted(set(self.decisions))[:DECISIONS]
    return Result(tuple(int(t) for t in tokens), float(score), nearest)


@functools.lru_cache(maxsize=8)
def _teacher_forced(model):
  """`model`'s teacher-forced logits as one graph for every shape: a
  search's steps call it with new shapes, which Keras' eager calls ran
  about 3x as slowly."""
  ids = tf.TensorSpec([None, None], tf.int32)
  return tf.function(lambda source, target: model((source, target),
                                                  training=False),
                     input_signature=[ids, ids], autograph=False)


def next_log_probs(model, sources, prefixes, vocabulary=None):
  """float64 [rows, vocab]: log P(next token | prefix, source), teacher
  forced through `model` (its float32 logits); over the ids `vocabulary`
  only (a shortlist's, renormalized over it, -inf elsewhere) if given."""
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
  if vocabulary is not None:
    listed = np.full_like(last, -np.inf)
    listed[:, vocabulary] = last[:, vocabulary]
    last = listed
  top = last.max(-1, keepdims=True)
  return last - (top + np.log(np.sum(np.exp(last - top), -1,
                                     keepdims=True)))


def search(model, sources, rules="ours", beam_size=4, alpha=0.6,
           max_length_offset=50, known=None, prefixes=None, vocabulary=None,
           bans=(0, 0)):
  """[Result] of each source (ids ending in EOS), by `rules` ("ours",
  "ctranslate2" or "transformers"); `beam_size` 1 is greedy decoding. Each output has at most
  its source's length + `max_length_offset` tokens, EOS included. `known`:
  a dict of log-probabilities already computed ((source index, prefix) ->
  [vocab]), shared by searches of the same model and sources, filled in.
  `prefixes`: each output's forced first tokens (ours), or None.
  `vocabulary`: a shortlist's ids, the only ones searched (`next_log_probs`).
  `bans`: (min_length, no_repeat_ngram_size), as decoding/bans.py's.
  """
  if rules not in RULES:
    raise ValueError(f"rules={rules!r}: one of {RULES}")
  known = {} if known is None else known
  prefixes = prefixes or [()] * len(sources)
  never = never_output(model.config.model.decoder_start)
  searches = [_Search(rules, beam_size, alpha, len(s) + max_length_offset, p,
                      bans, never) for s, p in zip(sources, prefixes)]
  while True:
    active = [(i, s) for i, s in enumerate(searches) if not s.done]
    if not active:
      return [s.result() for s in searches]
    rows = [(i, tokens) for i, s in active for tokens, _ in s.alive]
    missing = list(dict.fromkeys(r for r in rows if r not in known))
    if missing:
      for row, values in zip(missing, next_log_probs(
          model, [sources[i] for i, _ in missing],
          [tokens for _, tokens in missing], vocabulary)):
        known[row] = values
    for i, s in active:
      s.advance(np.stack([known[(i, tokens)] for tokens, _ in s.alive]))


def near_tie(model, source, result, precisions=(rounding.FLOAT32,),
              vocabulary=None, epsilon=None):
  """Whether one of `result`'s decisions was within rounding: its gap at
  most this reference's float32 bound on the two hypotheses' difference
  plus the largest of the implementations' (`precisions`) bounds on it
  (each a root of the sum of the hypotheses' squared bounds, their
  roundings independent, tests/rounding.py). The decisions' hypotheses are
  bounded as whole sentences: a gap between scores (log P / lp, lp >= 1) is
  within the same bound, and the penalty's few roundings more. With
  `epsilon`, one implementation computes the function of another layer
  norm epsilon (Transformers'): what that moves each hypothesis' log P
  counts too."""
  if not result.decisions:
    return False
  hypotheses = sorted({h for _, a, b in result.decisions for h in (a, b)})
  row = {h: i for i, h in enumerate(hypotheses)}
  sources = [source] * len(hypotheses)
  bounds = {}
  for precision in set(precisions) | {rounding.FLOAT32}:
    values, bound = rounding.sentence_bounds(
        model, sources, [list(h) for h in hypotheses], precision,
        vocabulary)
    bounds[precision] = bound + 8 * rounding.U32 * np.abs(values)
  pair = lambda p, a, b: math.hypot(bounds[p][row[a]], bounds[p][row[b]])
  moved = np.zeros(len(hypotheses))
  if epsilon is not None:
    targets = [list(h) for h in hypotheses]
    moved = np.abs(rounding.exact_token_log_probs(model, sources, targets)
                   - rounding.exact_token_log_probs(model, sources, targets,
                                                    epsilon)).sum(1)
  return any(gap <= pair(rounding.FLOAT32, a, b) + max(
      pair(p, a, b) for p in precisions) + moved[row[a]] + moved[row[b]]
             for gap, a, b in result.decisions)


def assert_near_ties(model, sources, lines, beam_size=4, alpha=0.6,
                     max_length_offset=50, why=lambda line: "",
                     precisions=(rounding.FLOAT32,), prefixes=None,
                     rules="ours", vocabulary=None, bans=(0, 0)):
  """Asserts that the reference search by `rules` meets a near tie on each
  of `lines` (indices into `sources`): a decision within the rounding of
  the implementations compared (`near_tie`), the only cause two
  implementations of one search can differ by there (module docstring)."""
  if not lines:
    return
  results = search(model, [sources[line] for line in lines], rules,
                   beam_size, alpha, max_length_offset,
                   prefixes=prefixes and [prefixes[line] for line in lines],
                   vocabulary=vocabulary, bans=bans)
  for line, result in zip(lines, results):
    assert near_tie(model, sources[line], result, precisions, vocabulary), (
        f"line {line} differs with no decision within rounding: "
        f"{why(line)} (reference: {result.tokens}, nearest decisions "
        f"{[round(gap, 6) for gap, _, _ in result.decisions[:4]]})")


def lines_apart(model, sources, first, second, beam_size=4, alpha=0.6,
                max_length_offset=50, prefixes=None,
                precisions=(rounding.FLOAT32,), vocabulary=None,
                bans=(0, 0)):
  """The lines where two runs of our search over `model` (each line's
  n-best outputs, as lists of ids) differ, each asserted to be a near tie
  (`assert_near_ties`)."""
  strip = lambda ids: tuple(int(t) for t in ids if t != PAD_ID)
  apart = [line for line, (a, b) in enumerate(zip(first, second))
           if [strip(x) for x in a] != [strip(x) for x in b]]
  assert_near_ties(model, sources, apart, beam_size, alpha,
                   max_length_offset,
                   lambda line: f"{first[line]} against {second[line]}",
                   precisions, prefixes, vocabulary=vocabulary, bans=bans)
  return apart
