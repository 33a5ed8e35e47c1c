"""How far any computation of the model can be from the exact one: a bound
on rounding error derived from the dtype's unit roundoff, the number of
terms of each sum and the magnitudes of the tensors at hand, for the
suite's comparisons of two paths through one model's weights.

Two paths (the Keras model's teacher forcing and an export's `score`; the
cached step and the full pass; TensorFlow on AVX2, AVX-512 or Eigen's
kernels; CTranslate2; PyTorch) compute the same arithmetic and round it
differently. Each elementary operation rounds its result x to x (1 + d),
|d| <= u, u being the unit roundoff of the dtype it stores in (float32
2**-24, float16 2**-11, bfloat16 2**-8); exp, log, rsqrt, erf and tanh are
within FUNCTION u. A sum of n terms, in any order and blocking, makes n such
roundings, each of at most u times the sum of the terms' magnitudes.

The rounding model. We take the roundings' errors d as independent with
mean zero, the model of probabilistic rounding-error analysis (Higham and
Mary, "A new approach to probabilistic rounding error analysis", SIAM J.
Sci. Comput. 41(5), 2019). To first order in u, an output o (a token's
log-probability) moves by sum_r c_r d_r, where c_r is the derivative of o
with respect to rounding r's result times that result. By Hoeffding's
inequality, |sum_r c_r d_r| exceeds

    LAMBDA * sqrt(sum_r (c_r u_r)**2)

with probability at most 2 exp(-LAMBDA**2 / 2) = FAILURE, whatever the
order of the operations: the bound holds on every CPU by construction. The
worst-case bound (sum_r |c_r| u_r) also holds, but adds up some 10**5
roundings a token as if all had one sign: 50 to 500 times the
probabilistic one for our models (0.03 a token in float32, 5 in float16),
loose enough to miss what the comparisons are there to catch.

`_Pass` recomputes the model from its weights (`named_weights`), adds a
zero perturbation to the result of every rounding point (a matmul, an add,
a softmax's sum, a layer norm's statistics, a cast to the storage dtype)
and records the sum over that point's roundings of (their magnitude times
u)**2; the gradient of an output with respect to the perturbations gives
each c_r. Every weight is taken to be rounded once, shared by all its uses
(a shared embedding's three): an implementation may store it in half
precision, fold a layer norm's gain into the matmul after it (and its bias
into that matmul's bias, n more terms) or scale it, as the decoding step
does. The values are computed in float64; the derivatives in float32 (their
relative error, 1e-6, is nothing to a bound), their squares in float64.

What it covers. First order: the next terms are O((n u)**2) relative for
the largest n of a sum on the path (d_ff = 256 terms: 2e-10 in float32,
1e-3 in bfloat16) against a bound of u sqrt(n) order, so a few percent
at most in bfloat16. Every kernel adds the products of a matmul (the
projections, the feed-forward network, the logits) in float32, whatever
it stores (oneDNN's and Eigen's; `tests/test_rounding.py` checks it on the
host); attention's products are taken to be added in the storage dtype,
the worst any kernel does (TensorFlow's Eigen bfloat16 einsum adds partial
sums in bfloat16).
"""

import dataclasses
import math

import numpy as np
import tensorflow as tf

from tf_transformer.layers import named_weights
from tf_transformer.special_ids import BOS_ID, PAD_ID

U = {"float32": 2.0**-24, "float16": 2.0**-11, "bfloat16": 2.0**-8}
# exp, log, rsqrt, sin, cos, erf, tanh and sigmoid: within a few units in
# the last place in every CPU kernel the suite runs.
FUNCTION = 4
# The chance that one output's bound fails under the rounding model: the
# suite compares some 10**5 outputs, so it fails by chance once in 10**4
# runs at most.
FAILURE = 1e-9
LAMBDA = math.sqrt(2 * math.log(2 / FAILURE))  # 6.55


@dataclasses.dataclass(frozen=True)
class Precision:
  """What one implementation rounds to: `storage`, the dtype its weights
  and activations are held in (and its attention's sums: see the module
  docstring); softmaxes, layer norms and the log-softmax run in float32 in
  every implementation we have (masks.masked_softmax, Keras'
  LayerNormalization, the float32 logits)."""
  storage: str = "float32"

  @property
  def u(self):
    return U[self.storage]


FLOAT32 = Precision()
U32 = U["float32"]

# What the reference computes in: float64 for its values; its derivatives
# (`bounds`' gradient passes) in float32, whose relative error (1e-6) is
# nothing to a bound and which runs several times as fast.
_DTYPE = [tf.float64]


def _float(x):
  """`x` as a tensor of the reference's dtype."""
  return tf.cast(x, _DTYPE[0])


def _square(x):
  """x^2 in float64, whatever the pass computes in: a square of u times a
  tiny magnitude (an attention weight of 1e-15) underflows float32."""
  return tf.square(tf.cast(x, tf.float64))


class _Pass:
  """One float64 pass of the model, its rounding points recorded."""

  def __init__(self, tape, precision):
    self.tape, self.precision = tape, precision
    self.points = []  # (perturbation, sum over its roundings of (m u)^2)
    # (weight name, kind, perturbation, operand, magnitude, roundings)
    self.uses = []
    self.members = []  # each model's weights, in the order of its pass

  def point(self, y, squares):
    """y with a zero perturbation the tape watches; `squares`: the sum,
    elementwise, of (magnitude * u)^2 over the roundings that make y."""
    if self.tape is None:
      return y
    p = tf.zeros_like(y)
    self.tape.watch(p)
    squares = tf.cast(squares, tf.float64)
    self.points.append((p, tf.stop_gradient(tf.broadcast_to(squares,
                                                            tf.shape(y)))))
    return y + p

  def store(self, y, squares=0.0):
    """`point` with one more rounding: y's to the storage dtype."""
    return self.point(y, tf.cast(squares, tf.float64)
                      + _square(self.precision.u * y))

  def use(self, name, kind, y, operand, magnitude, roundings=1):
    """Records a use of weight `name` whose result is y (the last point's
    value), so that the weight's own rounding can be charged to it
    (`_weight_squares`): `roundings` roundings, each within u of
    `magnitude` (the weight's absolute value, or more where it is made of
    several terms)."""
    if self.tape is not None:
      name = f"{len(self.members) - 1}:{name}"  # the model's own weight
      self.uses.append((name, kind, self.points[-1][0], operand, magnitude,
                        roundings))
    return y


def _f64(x):
  return None if x is None else tf.constant(np.asarray(x), _DTYPE[0])


def _dense(x, w):
  """x [..., n] times w [n, m] as one 2-D matmul (a broadcast batch of
  small float64 matmuls is several times slower)."""
  shape = tf.shape(x)
  flat = tf.matmul(tf.reshape(x, [-1, x.shape[-1]]), w)
  return tf.reshape(flat, tf.concat([shape[:-1], [w.shape[1]]], 0))


def _affine(run, x, affine, name, norm=None):
  """x W + b: n + 1 terms (the bias one more), each partial sum within the
  terms' magnitudes m = |x| |W| + |b|, so n + 1 roundings of at most m u.
  Where x is a layer norm's output (`norm`), an implementation may fold
  the norm's gain into W and its bias into b (decoding/step_weights.py):
  W's one rounding covers the product, and b then holds n + 1 more terms
  (b + beta W), each within |b| + |beta| |W|."""
  w, b = _f64(affine.kernel), _f64(affine.bias)
  n = w.shape[0]
  y = _dense(x, w) + b
  m = _dense(tf.abs(x), tf.abs(w)) + tf.abs(b)
  y = run.store(y, (n + 1) * _square(U32 * m))
  run.use(name + "/kernel", "affine", y, x, tf.abs(w))
  if norm is None:
    return run.use(name + "/bias", "bias", y, None, tf.abs(b))
  folded = tf.abs(b) + tf.linalg.matvec(tf.abs(w), tf.abs(_f64(norm.beta)),
                                        transpose_a=True)
  return run.use(name + "/bias", "bias", y, None, folded, n + 2)


def _layer_norm(run, x, norm, epsilon, name):
  """gamma (x - mean) / sqrt(var + eps) + beta over d terms, in float32,
  by any formula of ours or the engines' (two-pass variance or E[x^2] -
  mean^2; x inv - mean inv): the mean's d roundings within mean(|x|) u, the
  variance's 2d + 2 within E[x^2] u, rsqrt's FUNCTION u and the sum's one
  u, then four roundings of the result, each within (|x| + |mean|) |inv
  gamma| u or |beta| u, and the cast to the storage dtype."""
  g, b = _f64(norm.gamma), _f64(norm.beta)
  d = x.shape[-1]
  mean = run.point(tf.reduce_mean(x, -1, keepdims=True),
                   d * _square(U32 * tf.reduce_mean(tf.abs(x), -1,
                                                    keepdims=True)))
  square_mean = tf.reduce_mean(tf.square(x), -1, keepdims=True)
  variance = run.point(
      tf.reduce_mean(tf.square(x - mean), -1, keepdims=True),
      (2 * d + 2) * _square(U32 * square_mean))
  inverse = run.point(tf.math.rsqrt(variance + epsilon),
                      (FUNCTION**2 + 1) * _square(U32 * tf.math.rsqrt(
                          variance + epsilon)))
  y = (x - mean) * inverse * g + b
  spread = (tf.abs(x) + tf.abs(mean)) * inverse * tf.abs(g)
  y = run.store(y, 4 * _square(U32 * spread) + _square(U32 * b))
  run.use(name + "/gamma", "scale", y, (x - mean) * inverse, tf.abs(g))
  return run.use(name + "/beta", "bias", y, None, tf.abs(b))


def _activation(run, x, activation):
  if activation == "relu":
    return tf.nn.relu(x)  # exact
  y = {"swish": tf.nn.silu,
       "gelu": lambda v: tf.nn.gelu(v, approximate=False),
       "gelu_tanh": lambda v: tf.nn.gelu(v, approximate=True)}[activation](x)
  # x f(x): the function within FUNCTION u of its magnitude (at most |x|),
  # then a few products and sums (4 more) of x's magnitude.
  return run.store(y, (FUNCTION**2 + 4) * _square(run.precision.u * x))


def _softmax(run, scores, mask):
  """In float32 (every implementation's): exp(s - max) within FUNCTION u
  of itself, their sum of L terms (L roundings within the sum), each
  quotient one more, then the cast to the storage dtype."""
  scores = tf.where(mask, scores, _float(-1e30))
  e = tf.exp(scores - tf.reduce_max(scores, -1, keepdims=True))
  e = run.point(e, _square(FUNCTION * U32 * e))
  length = tf.reduce_sum(_float(mask), -1, keepdims=True)
  total = tf.reduce_sum(e, -1, keepdims=True)
  total = run.point(total, tf.cast(length, tf.float64) * _square(
      U32 * total))
  weights = e / total
  return run.store(weights, _square(U32 * weights))


def _attention(run, query, key, mask, attention, name, query_norm=None,
               key_norm=None):
  """Eq. 1 for each head: scores of d_k products (d_k roundings within
  |q| |k|, and the scale's), the softmax, and outputs of L products (L
  roundings within |weights| |v|)."""
  u = run.precision.u
  heads = attention.num_heads
  split = lambda x: tf.transpose(
      tf.reshape(x, tf.concat([tf.shape(x)[:2], [heads, -1]], 0)),
      [0, 2, 1, 3])
  q = split(_affine(run, query, attention.query, name + "/query", query_norm))
  k = split(_affine(run, key, attention.key, name + "/key", key_norm))
  v = split(_affine(run, key, attention.value, name + "/value", key_norm))
  d_k = int(q.shape[-1])
  scale = 1.0 / math.sqrt(d_k)
  scores = tf.matmul(q, k, transpose_b=True) * scale
  m = tf.matmul(tf.abs(q), tf.abs(k), transpose_b=True) * scale
  scores = run.store(scores, (d_k + 1) * _square(u * m))
  weights = _softmax(run, scores, mask)
  length = int(weights.shape[-1])
  context = run.store(tf.matmul(weights, v),
                      length * _square(u * tf.matmul(weights, tf.abs(v))))
  merged = tf.reshape(tf.transpose(context, [0, 2, 1, 3]),
                      tf.concat([tf.shape(query)[:2], [-1]], 0))
  return _affine(run, merged, attention.output, name + "/output"), weights


def _sinusoids(length, d_model, kind):
  """The table of section 3.5 in float64, and the sum of squares of a
  float32 computation's roundings: the angle pos * f within a few u of
  itself (so its sine within that times |angle|), the sine FUNCTION u."""
  positions = np.arange(length, dtype=np.float64)[:, None]
  if kind == "sinusoidal_opennmt":
    increment = math.log(10000.0) / (d_model / 2 - 1)
    angles = (positions + 1) * np.exp(np.arange(d_model // 2) * -increment)
    table = np.concatenate([np.sin(angles), np.cos(angles)], -1)
    spread = np.concatenate([angles, angles], -1)
  else:
    angles = positions / np.power(10000.0, np.arange(0, d_model, 2) / d_model)
    if kind == "sinusoidal_halves":
      table = np.concatenate([np.sin(angles), np.cos(angles)], -1)
      spread = np.concatenate([angles, angles], -1)
    else:
      table = np.stack([np.sin(angles), np.cos(angles)], -1).reshape(
          length, -1)[:, :d_model]
      spread = np.stack([angles, angles], -1).reshape(length, -1)[:, :d_model]
  return table, (FUNCTION**2 + 9 * spread**2) * U32**2


def _embed(run, w, ids, name, positions, zero_start=False):
  """The embedding's rows (rounded to the storage dtype, a use of the
  table), times the scale (one rounding unless a power of two), plus the
  positions (a learned table's use, or the sinusoids' own roundings) and
  the sum's rounding."""
  table = _f64(getattr(w, name))
  x = tf.gather(table, ids) * w.embedding_scale
  if zero_start:
    x = x * _float(tf.range(tf.shape(ids)[1]) > 0)[:, None]
  exact = math.log2(w.embedding_scale) % 1 == 0
  x = run.point(x, 0.0 if exact else _square(run.precision.u * x))
  x = run.use(_table(w, name), "lookup", x, (ids, w.embedding_scale,
                                             zero_start), tf.abs(table))
  length = int(ids.shape[1])
  if positions is not None:  # a learned table
    rows = _f64(positions)[:length]
    y = run.store(x + rows)
    return run.use(name + "/positions", "rows", y, length,
                   tf.abs(_f64(positions)))
  sines, squares = _sinusoids(length, int(table.shape[1]),
                              w.positional_encoding)
  sines, squares = _float(sines), tf.constant(squares, tf.float64)
  y = x + sines
  return run.store(y, squares + _square(run.precision.u * sines))


def _table(w, name):
  """One name for an embedding matrix however many roles share it."""
  matrix = getattr(w, name)
  for other in ("source_embedding", "target_embedding", "output_embedding"):
    if getattr(w, other) is matrix:
      return other
  return name


def _stack(run, w, x, stack, self_mask, memory, cross_mask, name,
           memory_norm=None):
  """(the stack's output, the norm whose output it is (or None), the
  attention weights of each attention, in order)."""
  post = w.norm_position == "post"
  attention_weights = []
  last = [None]  # the norm whose output x is

  def residual(x, norm, norm_name, sublayer):
    normalize = lambda h: _layer_norm(run, h, norm, w.epsilon, norm_name)
    y = sublayer(x, last[0]) if post else sublayer(normalize(x), norm)
    total = run.store(x + y)
    last[0] = norm if post else None
    return normalize(total) if post else total

  def attend(h, key, mask, attention, where, norm, key_norm):
    out, weights = _attention(run, h, key, mask, attention, where, norm,
                              key_norm)
    attention_weights.append(weights)
    return out

  for i, layer in enumerate(stack.layers):
    at = f"{name}/{i}"
    x = residual(x, layer.self_attention_norm, at + "/self_norm",
                 lambda h, norm: attend(h, h, self_mask, layer.self_attention,
                                        at + "/self", norm, norm))
    if layer.cross_attention is not None:
      x = residual(x, layer.cross_attention_norm, at + "/cross_norm",
                   lambda h, norm: attend(h, memory, cross_mask,
                                          layer.cross_attention,
                                          at + "/cross", norm, memory_norm))
    x = residual(x, layer.feed_forward_norm, at + "/ffn_norm",
                 lambda h, norm: _affine(run, _activation(run, _affine(
                     run, h, layer.feed_forward.inner, at + "/inner", norm),
                                                          w.activation),
                                         layer.feed_forward.outer,
                                         at + "/outer"))
  if stack.final_norm is not None:
    x = _layer_norm(run, x, stack.final_norm, w.epsilon, name + "/norm")
    last[0] = stack.final_norm
  return x, last[0], attention_weights


def _numpy(value):
  """A weight (a Keras variable of any backend) as a float64 array."""
  if hasattr(value, "numpy"):  # a Keras or TensorFlow variable
    value = value.numpy()
  return np.asarray(value, np.float64)


def _weights(model):
  """The model's named weights as float64 NumPy arrays (one array for a
  matrix that several roles share, as the model holds one variable)."""
  seen = {}

  def convert(v):
    if isinstance(v, (str, float, int, type(None))):
      return v
    key = id(v)
    if key not in seen:
      seen[key] = _numpy(v)
    return seen[key]

  return tf.nest.map_structure(convert, model.named_weights())


def forward(run, weights, source, target_in, logits=True):
  """(float64 teacher-forced logits [batch, T, vocab] (None without
  `logits`; the decoder's output [batch, T, d_model] with "hidden"),
  {"encoder_self", "decoder_self", "encoder_decoder"}: per layer [batch,
  heads, queries, keys] attention weights), the rounding points on
  `run`."""
  w = weights
  run.members.append(weights)
  source = tf.constant(source, tf.int32)
  target_in = tf.constant(target_in, tf.int32)
  source_keys = (source != PAD_ID)[:, None, None, :]
  length = int(target_in.shape[1])
  causal = tf.linalg.band_part(tf.ones([length, length], tf.bool), -1, 0)
  decoder_mask = causal[None, None] & (target_in != PAD_ID)[:, None, None, :]
  x = _embed(run, w, source, "source_embedding", w.source_positions)
  memory, memory_norm, encoder_self = _stack(
      run, w, x, w.encoder, source_keys, None, None, "encoder")
  y = _embed(run, w, target_in, "target_embedding", w.target_positions,
             zero_start=w.decoder_start == "zero")
  h, h_norm, decoder_weights = _stack(run, w, y, w.decoder, decoder_mask,
                                      memory, source_keys, "decoder",
                                      memory_norm)
  attention = {"encoder_self": encoder_self,
               "decoder_self": decoder_weights[0::2],
               "encoder_decoder": decoder_weights[1::2]}
  if logits == "hidden":  # the decoder's output, before the projection
    return h, attention
  if not logits:
    return None, attention
  e = _f64(w.output_embedding)
  logits = tf.einsum("btd,vd->btv", h, e)
  m = tf.einsum("btd,vd->btv", tf.abs(h), tf.abs(e))
  logits = run.store(logits, (int(e.shape[1]) + 1) * _square(U32 * m))
  logits = run.use(_table(w, "output_embedding"), "logits", logits, h,
                   tf.abs(e))
  bias = _f64(np.zeros(e.shape[0]) if w.output_bias is None
               else w.output_bias)
  logits = run.point(logits + bias, _square(U32 * (logits + bias)))
  # The output bias, or a zero one, may hold the last norm's bias folded
  # in (beta E^T, d_model + 1 terms), as the decoding step's does.
  folded = tf.abs(bias)
  if h_norm is not None:
    folded += tf.linalg.matvec(tf.abs(e), tf.abs(_f64(h_norm.beta)))
  logits = run.use("output_bias", "bias", logits, None, folded,
                   int(e.shape[1]) + 2)
  return logits, attention


def log_softmax(run, logits, vocabulary=None):
  """The float32 log-softmax of every implementation over the last axis
  (or over the ids `vocabulary` only, a shortlist's, in its order): the
  largest logit subtracted (exact), V exponentials within FUNCTION u,
  their sum (V roundings within the sum), its log (FUNCTION u of its
  magnitude, at least one) and the difference's rounding."""
  if vocabulary is not None:
    logits = tf.gather(logits, vocabulary, axis=-1)
  top = tf.reduce_max(logits, -1, keepdims=True)
  e = tf.exp(logits - top)
  e = run.point(e, _square(FUNCTION * U32 * e))
  total = tf.reduce_sum(e, -1, keepdims=True)
  total = run.point(total, int(logits.shape[-1]) * _square(U32 * total))
  log_total = tf.math.log(total)
  log_total = run.point(log_total, _square(FUNCTION * U32 * tf.maximum(
      tf.abs(log_total), 1.0)))
  log_probs = logits - top - log_total
  return run.point(log_probs, _square(U32 * log_probs))


def _weight_squares(run, gradients):
  """[rows]: the sum over the weights of (d o / d weight * magnitude *
  u)^2 times their roundings, each weight's derivative summed over its
  uses (one rounding a weight, shared by every use: a shared embedding's
  three)."""
  derivatives, magnitudes = {}, {}
  for (name, kind, _, operand, magnitude, roundings), g in zip(run.uses,
                                                               gradients):
    if g is None:
      continue
    if kind == "affine" and len(operand.shape) == 2:  # one position a row
      d = operand[:, :, None] * g[:, None, :]
    elif kind == "affine":
      d = tf.einsum("bpi,bpj->bij", operand, g)
    elif kind == "bias":
      d = tf.reduce_sum(tf.reshape(g, [g.shape[0], -1, g.shape[-1]]), 1)
    elif kind == "scale":
      d = tf.reduce_sum(tf.reshape(g * operand, [g.shape[0], -1,
                                                 g.shape[-1]]), 1)
    elif kind == "lookup":
      ids, scale, zero_start = operand
      g = g * scale
      if zero_start:
        g = g * _float(tf.range(tf.shape(ids)[1]) > 0)[:, None]
      vocab = magnitude.shape[0]
      d = tf.einsum("bpv,bpd->bvd", tf.one_hot(ids, vocab, dtype=_DTYPE[0]),
                    g)
    elif kind == "logits":
      d = tf.einsum("btv,btd->bvd", g, operand)
    else:  # "rows": a learned position table's first `operand` rows
      rows = magnitude.shape[0]
      d = tf.pad(g, [[0, 0], [0, rows - operand], [0, 0]])
    derivatives[name] = derivatives.get(name, 0.0) + d
    magnitudes.setdefault(name, (roundings, magnitude))
  u = run.precision.u
  total = 0.0
  for name, d in derivatives.items():
    roundings, magnitude = magnitudes[name]
    total += roundings * tf.reduce_sum(tf.reshape(
        _square(tf.cast(d, tf.float64) * tf.cast(magnitude, tf.float64) * u),
        [d.shape[0], -1]), -1)
  return total


def _members(model):
  return list(getattr(model, "members", [model]))


def model_log_probs(run, model, source, target_in, vocabulary=None,
                    renormalized=True):
  """(float64 log-probabilities [batch, T, vocab] of `model`'s teacher
  forcing, as its searches and scorers compute them, the rounding points on
  `run`; the attention weights of its first member). An `Ensemble`'s
  members each in their own pass, combined as it does: the mean of their
  log-probabilities renormalized (not `renormalized`: as `Ensemble`
  returns it), or the log of their mean probability (and a few roundings
  more of its result)."""
  passes = [forward(run, _weights(m), source, target_in)
            for m in _members(model)]
  members = [log_softmax(run, logits, vocabulary) for logits, _ in passes]
  if len(members) == 1:
    return members[0], passes[0][1]
  if model.average == "log_probs":
    mean = tf.add_n(members) / len(members)
    mean = run.point(mean, len(members) * _square(U32 * tf.add_n(
        [tf.abs(m) for m in members]) / len(members)))
    # The search renormalizes the mean (`Ensemble.__call__` and its step
    # give it as it is).
    combined = log_softmax(run, mean) if renormalized else mean
  else:
    combined = tf.math.log(tf.add_n([tf.exp(m) for m in members])
                           / len(members))
    combined = run.point(combined, (FUNCTION**2 + len(members) + 2) * _square(
        U32 * tf.maximum(tf.abs(combined), 1.0)))
  return combined, passes[0][1]


# What one replicated pass of `bounds` may hold: rows x (S + T) x max(S,
# T) positions. The tape keeps every (float32) activation of the pass: some
# 2-3 GB at this size for the suite's models, against a 24 GB host's two
# test processes.
PASS_SIZE = 2**18


def bounds(model, source, target_in, outputs, precision=FLOAT32,
           cells=None, trim=False):
  """(values [batch, K], bounds [batch, K]): `outputs(run, model, source,
  target_in, index)` ([rows, K] float64 from `model_log_probs` or `forward`
  on `run`, each row a function of that row's inputs alone, `index` each
  row's in the batch given) computed exactly
  (float64) from the weights, and LAMBDA times the root of the module
  docstring's sum of squares for an implementation that rounds as
  `precision`: |an implementation's output - value| <= bound, but with
  probability FAILURE.

  Each output's derivatives come from one backward pass over the rows
  replicated once an output (row r's copy k contributes its output k): the
  rows are independent, so one pass gives every output of every row.

  Args:
    model: a `Transformer`, or an `Ensemble` of them.
    source: [batch, S] int ids, PAD-padded.
    target_in: [batch, T] int ids, BOS first, PAD-padded.
    outputs: the function.
    precision: the implementation's `Precision`.
    cells: [batch, K] bool, the outputs to bound (the others get 0); all
      by default.
    trim: each pass may drop the columns that are PAD in all its rows
      (where `outputs` reads no position by the arrays' width).
  """
  source, target_in = np.asarray(source), np.asarray(target_in)
  size = (source.shape[1] + target_in.shape[1]) * max(source.shape[1],
                                                      target_in.shape[1])
  return _bounds(model, (source, target_in), outputs, precision, cells,
                 size, trim)


def _bounds(model, arrays, outputs, precision, cells, size, trim=False):
  """`bounds` for any inputs: `arrays`, row-aligned (one row a batch
  entry), given to `outputs(run, model, *rows of arrays, index)`; `size`
  what one row costs a pass (`PASS_SIZE`)."""
  values = outputs(_Pass(None, precision), model, *arrays,
                   np.arange(len(arrays[0]))).numpy()
  wanted = np.argwhere(np.ones(values.shape, bool) if cells is None
                       else np.asarray(cells))  # (row, column) pairs
  squares = np.zeros(values.shape)
  _DTYPE[0] = tf.float32
  try:
    rows_a_pass = max(1, PASS_SIZE // max(size, 1))
    for first in range(0, len(wanted), rows_a_pass):
      index, chosen = wanted[first:first + rows_a_pass].T
      rows = [np.asarray(a)[index] for a in arrays]
      if trim:  # the pass's own width
        rows = [a[:, :max(1, int(np.max(np.nonzero(a.any(0))[0], initial=0))
                          + 1)] for a in rows]
      squares[index, chosen] = _squares(model, rows, outputs, precision,
                                        index, chosen)
  finally:
    _DTYPE[0] = tf.float64
  return values, LAMBDA * np.sqrt(squares)


def _squares(model, arrays, outputs, precision, index, chosen):
  """`bounds`' sums of squares of output `chosen[i]` of row `index[i]`,
  each replicated row (`arrays`) giving one."""
  with tf.GradientTape(persistent=True) as tape:
    run = _Pass(tape, precision)
    replicated = outputs(run, model, *arrays, index)
    total = tf.reduce_sum(tf.gather(replicated, chosen, batch_dims=1))
  perturbations = [p for p, _ in run.points]
  used = [use[2] for use in run.uses]
  gradients = tape.gradient(total, perturbations + used)
  part = np.zeros(len(index))
  for g, (_, s) in zip(gradients, run.points):
    if g is not None:
      part += tf.reduce_sum(tf.reshape(_square(g) * s,
                                       [g.shape[0], -1]), -1).numpy()
  if run.uses:
    part += np.asarray(_weight_squares(run, gradients[len(perturbations):]))
  del tape
  return part


def _padded(rows, width=None):
  width = max([len(r) for r in rows] + [width or 1])
  out = np.full((len(rows), width), PAD_ID, np.int32)
  for i, r in enumerate(rows):
    out[i, :len(r)] = r
  return out


def token_bounds(model, sources, targets, precision=FLOAT32,
                 vocabulary=None):
  """For id lists `sources` and `targets` (each target's tokens as the
  model is to output them, EOS included where it ends): (exact log P of
  each token [rows, T + 1], the bound on one implementation's [rows, T +
  1]), the last column the whole target's log P (its bound is not the
  tokens' bounds summed: their roundings partly cancel). PAD columns hold
  0 and 0. `vocabulary`: a shortlist's ids, over which the log-softmax
  runs."""
  source = _padded(sources)
  target_in = _padded([[BOS_ID] + list(t[:-1]) if len(t) else [BOS_ID]
                       for t in targets])
  target_out = _padded([list(t) for t in targets], target_in.shape[1])
  if vocabulary is not None:
    position = {v: i for i, v in enumerate(vocabulary)}
    target_out = np.vectorize(lambda t: position.get(t, 0))(target_out)
  real = tf.constant(np.asarray([[1.0] * len(t) + [0.0] * (
      target_out.shape[1] - len(t)) for t in targets]), tf.float64)
  picked_ids = tf.constant(target_out, tf.int32)

  def outputs(run, model, source, target_in, index):
    log_probs, _ = model_log_probs(run, model, source, target_in,
                                   vocabulary)
    picked = tf.gather(log_probs, tf.gather(picked_ids, index),
                       batch_dims=2) * _float(tf.gather(real, index))
    return tf.concat([picked, tf.reduce_sum(picked, 1, keepdims=True)], 1)

  cells = np.concatenate([real.numpy() > 0, np.ones((len(targets), 1),
                                                    bool)], 1)
  return bounds(model, source, target_in, outputs, precision, cells)


def attention_bounds(model, sources, targets, kind="encoder_decoder",
                     layer=0, precision=FLOAT32, heads=False):
  """(exact attention weights, averaged over the heads, of `kind`'s layer
  `layer` in the teacher-forced pass [rows, T + 1, S] ([rows, heads, T +
  1, S] with `heads`), their bounds), for id lists as `token_bounds` takes;
  entries past a line's lengths hold 0. An `Ensemble`'s: its members'
  averaged (and the average's roundings) where they have one shape, else
  its lead's (`Ensemble.attention_weights`)."""
  members = _members(model)
  if len(members) > 1 and not model._one_attention_shape():  # pylint: disable=protected-access
    members = [model.lead]
  results = [_attention_bounds(m, sources, targets, kind, layer, precision,
                               heads) for m in members]
  values = np.mean([v for v, _ in results], 0)
  bound = np.mean([b for _, b in results], 0) + (
      len(members) - 1) * 2 * U32 * values
  return values, bound


def _attention_bounds(model, sources, targets, kind, layer, precision,
                      heads):
  source = _padded(sources)
  target_in = _padded([[BOS_ID] + list(t) for t in targets])
  queries, keys = target_in.shape[1], source.shape[1]
  if kind == "encoder_self":
    queries = keys
  elif kind == "decoder_self":
    keys = queries

  def outputs(run, model, source, target_in, index):
    del index  # the rows' own inputs are all it reads
    _, attention = forward(run, _weights(model), source, target_in,
                           logits=False)
    weights = attention[kind][layer]
    if not heads:
      weights = tf.reduce_mean(weights, 1)
    return tf.reshape(weights, [weights.shape[0], -1])

  lengths = lambda rows: np.array([len(r) for r in rows])
  query_lengths = lengths(sources) if kind == "encoder_self" else (
      lengths(targets) + 1)
  key_lengths = lengths(sources) if kind != "decoder_self" else (
      lengths(targets) + 1)
  cells = ((np.arange(queries)[None, :, None] < query_lengths[:, None, None])
           & (np.arange(keys)[None, None, :] < key_lengths[:, None, None]))
  shape = (len(sources), queries, keys)
  if heads:
    count = _weights(model).encoder.layers[0].self_attention.num_heads
    cells = np.repeat(cells[:, None], count, 1)
    shape = (len(sources), count, queries, keys)
  values, bound = bounds(model, source, target_in, outputs, precision,
                         cells.reshape(len(sources), -1))
  return values.reshape(shape), bound.reshape(shape)


def reference_log_probs(model, sources, prefixes):
  """float64 [rows, vocab]: log P(next token | prefix, source), exactly
  (float64) from `model`'s weights, for id lists."""
  source = _padded(sources)
  target_in = _padded([[BOS_ID] + list(p) for p in prefixes])
  log_probs, _ = model_log_probs(_Pass(None, FLOAT32), model, source,
                                 target_in)
  return tf.gather(log_probs, [len(p) for p in prefixes],
                   batch_dims=1).numpy()


def sum_bound(terms):
  """Two float32 sums of the same `terms` (an array, summed over its last
  axis) in any two orders: each within (n - 1) u of the sum of the terms'
  magnitudes (Higham 2002, 4.2), so within twice that of each other."""
  terms = np.asarray(terms, np.float64)
  return 2 * (terms.shape[-1] - 1) * U32 * np.sum(np.abs(terms), -1)


def assert_within(got, want, bound, what=""):
  """|got - want| <= bound elementwise, with the worst element named."""
  got, want = np.asarray(got, np.float64), np.asarray(want, np.float64)
  bound = np.asarray(bound, np.float64)
  if bound.size == got.size:
    bound = bound.reshape(got.shape)
  got, want, bound = np.broadcast_arrays(got, want, bound)
  gap = np.abs(got - want)
  worst = np.unravel_index(np.argmax(gap - bound), gap.shape) if gap.size \
      else ()
  assert np.all(gap <= bound), (
      f"{what}: |{got[worst]} - {want[worst]}| = {gap[worst]:.3g} > bound "
      f"{bound[worst]:.3g} at {worst}")


def sentence_bounds(model, sources, targets, precision=FLOAT32,
                    vocabulary=None):
  """(exact log P of each whole target [rows], its bound [rows]): the last
  column of `token_bounds`, in one gradient pass."""
  source = _padded(sources)
  target_in = _padded([[BOS_ID] + list(t[:-1]) if len(t) else [BOS_ID]
                       for t in targets])
  target_out = _padded([list(t) for t in targets], target_in.shape[1])
  real = tf.constant(target_out != PAD_ID, tf.float64)
  if vocabulary is not None:
    position = {v: i for i, v in enumerate(vocabulary)}
    target_out = np.vectorize(lambda t: position.get(t, 0))(target_out)
  picked_ids = tf.constant(target_out, tf.int32)

  def outputs(run, model, source, target_in, index):
    log_probs, _ = model_log_probs(run, model, source, target_in,
                                   vocabulary)
    picked = tf.gather(log_probs, tf.gather(picked_ids, index),
                       batch_dims=2) * _float(tf.gather(real, index))
    return tf.reduce_sum(picked, 1, keepdims=True)

  values, bound = bounds(model, source, target_in, outputs, precision)
  return values[:, 0], bound[:, 0]


# A search's score, log P / lp with GNMT's lp = ((5 + |Y|) / 6)^alpha >= 1,
# in float32: the power within FUNCTION u, two divisions one u each.
PENALTY = FUNCTION + 3


def output_bounds(model, sources, outputs, precision=FLOAT32,
                  vocabulary=None):
  """The bound on one implementation's log P of each output and on its
  search score (log P / lp, within the same bound divided by lp >= 1 and
  PENALTY roundings of itself), for id lists (`outputs` as searched:
  EOS where they ended, no PAD); over a shortlist's `vocabulary` if
  given."""
  values, bound = sentence_bounds(model, sources, outputs, precision,
                                  vocabulary)
  return bound + PENALTY * U32 * np.abs(values)


def unpadded(ids):
  """An id array's rows as lists without PAD."""
  return [[int(t) for t in row if t != PAD_ID] for row in np.asarray(ids)]


def search_bounds(model, sources, ids, precision=FLOAT32, vocabulary=None):
  """[lines, beams]: `output_bounds` of each output of a search's ids
  [lines, beams, length] (PAD after each output's EOS), whose sources are
  the id lists `sources`."""
  ids = np.asarray(ids)
  if ids.ndim == 2:
    ids = ids[:, None]
  if not ids.size:
    return np.zeros(ids.shape[:2])
  outputs = [unpadded(ids[:, beam]) for beam in range(ids.shape[1])]
  return np.stack([output_bounds(model, sources, column, precision,
                                 vocabulary) for column in outputs], 1)


def logit_bounds(model, sources, prefixes, precision=FLOAT32):
  """(exact logits [rows, vocab] of the next token after each prefix (id
  lists, BOS left out) given its source, their bounds): the comparison of
  whole logit vectors, one gradient row per logit."""
  pairs = [(tuple(s), tuple(p)) for s, p in zip(sources, prefixes)]
  # Each (source, prefix) once, shortest first (`bounds`' passes trim).
  unique = sorted(dict.fromkeys(pairs), key=lambda pair: len(pair[1]))
  source = _padded([s for s, _ in unique])
  target_in = _padded([[BOS_ID] + list(p) for _, p in unique])
  last = tf.constant([len(p) for _, p in unique], tf.int32)

  def outputs(run, model, source, target_in, index):
    logits, _ = forward(run, _weights(_members(model)[0]), source, target_in)
    return tf.gather(logits, tf.gather(last, index), batch_dims=1)

  values, bound = bounds(model, source, target_in, outputs, precision,
                         trim=True)
  position = {pair: row for row, pair in enumerate(unique)}
  rows = [position[pair] for pair in pairs]
  return values[rows], bound[rows]


def memory_bounds(model, sources, precision=FLOAT32):
  """(the exact encoder output [rows, S, d_model] of each source (id lists),
  its bounds; 0 past each source's length)."""
  source = _padded(sources)
  lengths = np.array([len(s) for s in sources])
  d_model = int(np.asarray(model.named_weights().source_embedding).shape[1])

  def outputs(run, model, source, target_in, index):
    del target_in, index  # the rows' own sources are all it reads
    w = _weights(_members(model)[0])
    run.members.append(w)
    source = tf.constant(source, tf.int32)
    x = _embed(run, w, source, "source_embedding", w.source_positions)
    memory, _, _ = _stack(run, w, x, w.encoder,
                          (source != PAD_ID)[:, None, None, :], None, None,
                          "encoder")
    return tf.reshape(memory, [tf.shape(memory)[0], -1])

  cells = np.repeat(np.arange(source.shape[1])[None, :] < lengths[:, None],
                    d_model, axis=1)
  values, bound = bounds(model, source, source[:, :1], outputs, precision,
                         cells)
  shape = (len(sources), source.shape[1], d_model)
  return values.reshape(shape), bound.reshape(shape)


def next_token_bounds(model, sources, prefixes, precision=FLOAT32,
                      renormalized=True):
  """(exact log-probabilities [rows, vocab] of the next token after each
  prefix (id lists, BOS left out) given its source, their bounds), as
  `model_log_probs` gives them."""
  source = _padded(sources)
  target_in = _padded([[BOS_ID] + list(p) for p in prefixes])
  last = tf.constant([len(p) for p in prefixes], tf.int32)

  def outputs(run, model, source, target_in, index):
    log_probs, _ = model_log_probs(run, model, source, target_in,
                                   renormalized=renormalized)
    return tf.gather(log_probs, tf.gather(last, index), batch_dims=1)

  return bounds(model, source, target_in, outputs, precision, trim=True)


class _Options:
  """What `_stack` reads of a model besides its stacks, for a layer."""

  def __init__(self, config):
    self.norm_position = config.get("norm_position", "post")
    self.epsilon = config.get("layer_norm_epsilon", 1e-6)
    self.activation = config.get("activation", "relu")


def _mask(mask):
  """A boolean mask broadcastable to [rows, heads, queries, keys]: a
  [rows, keys] padding mask, or one of that rank already."""
  mask = tf.cast(mask, tf.bool)
  return mask[:, None, None, :] if len(mask.shape) == 2 else mask


def _layer_outputs(run, layer, inputs):
  """`layer_call`'s outputs as one [rows, K] tensor (flattened,
  concatenated)."""
  out = layer_call(run, layer, **inputs)
  return tf.concat([tf.reshape(t, [tf.shape(t)[0], -1])
                    for t in tf.nest.flatten(out)], 1)


def layer_call(run, layer, **inputs):
  """The reference of one public layer's call (its attention,
  feed-forward, residual, embedding and stack layers) on `inputs` (by call
  argument: tensors of the reference's dtype or row-aligned arrays), its
  rounding points on `run`: what the layer returns."""
  name = type(layer).__name__
  config = layer.get_config()
  named = layer.named_weights() if hasattr(layer, "named_weights") else None
  named = tf.nest.map_structure(
      lambda v: v if isinstance(v, (str, float, int, type(None))) else
      _numpy(v), named)
  run.members.append(named)
  x = lambda key: _float(inputs[key])
  flat = lambda t: t
  if name == "ScaledDotProductAttention":
    q, k, v = x("query"), x("key"), x("value")
    mask = tf.broadcast_to(_mask(inputs["attention_mask"]),
                           [q.shape[0], q.shape[1], q.shape[2], k.shape[2]])
    scale = 1.0 / math.sqrt(int(q.shape[-1]))
    u = run.precision.u
    scores = tf.matmul(q, k, transpose_b=True) * scale
    m = tf.matmul(tf.abs(q), tf.abs(k), transpose_b=True) * scale
    scores = run.store(scores, (int(q.shape[-1]) + 2) * _square(u * m))
    weights = _softmax(run, scores, mask)
    context = run.store(tf.matmul(weights, v), int(k.shape[2]) * _square(
        u * tf.matmul(weights, tf.abs(v))))
    return context, weights
  if name == "MultiHeadAttention":
    query = x("query")
    key = x("value") if "value" in inputs else query
    mask = _mask(inputs["attention_mask"])
    out, _ = _attention(run, query, key, mask, named, "attention")
    return flat(out)
  if name == "SharedEmbedding":
    table = _f64(named)
    y = tf.gather(table, tf.cast(inputs["x"], tf.int32))
    scale = math.sqrt(config["d_model"]) if config["scale"] else 1.0
    exact = math.log2(scale) % 1 == 0
    return flat(run.point(y * scale, 0.0 if exact else _square(
        run.precision.u * y * scale)))
  if name == "SinusoidalPositionalEncoding":
    inputs_x = x("x")
    sines, squares = _sinusoids(int(inputs_x.shape[1]),
                                int(inputs_x.shape[2]), layer.kind)
    return flat(run.store(inputs_x + _float(sines), _float(squares)))
  if name == "LearnedPositionalEmbedding":
    inputs_x = x("x")
    rows = _f64(named)[:int(inputs_x.shape[1])]
    return flat(run.store(inputs_x + rows))
  options = _Options(config)
  if name == "PositionwiseFeedForward":
    inner = _affine(run, x("x") if isinstance(inputs, dict) else
                    _float(inputs), named.inner, "inner")
    return flat(_affine(run, _activation(run, inner, config["activation"]),
                        named.outer, "outer"))
  if name == "ResidualNorm":
    total = run.store(x("x") + x("sublayer_output"))
    if config["norm_position"] == "pre":
      return flat(total)
    return flat(_layer_norm(run, total, named, config["layer_norm_epsilon"],
                            "norm"))
  if name in ("EncoderLayer", "Encoder"):
    stack = named if name == "Encoder" else named_weights.Stack((named,),
                                                                None)
    mask = _mask(inputs["padding_mask"])
    out, _, _ = _stack(run, options, x("x"), stack, mask, None, None,
                       "stack")
    return flat(out)
  if name == "DecoderLayer":
    out, _, _ = _stack(run, options, x("x"),
                       named_weights.Stack((named,), None),
                       _mask(inputs["self_attention_mask"]), x("memory"),
                       _mask(inputs["cross_attention_mask"]), "stack")
    return flat(out)
  if name == "Decoder":
    target = tf.cast(inputs["target_padding_mask"], tf.bool)
    length = int(target.shape[1])
    causal = tf.constant(np.tril(np.ones((length, length), bool)))
    self_mask = causal[None, None] & target[:, None, None, :]
    out, _, _ = _stack(run, options, x("x"), named, self_mask, x("memory"),
                       _mask(inputs["memory_padding_mask"]), "stack")
    return flat(out)
  raise NotImplementedError(f"no float64 reference of {name}")


def layer_bounds(layer, inputs, precision=FLOAT32):
  """(the exact outputs of `layer` (one of tf_transformer.layers' public
  attention, feed-forward, residual and stack layers) on `inputs` (a dict
  by call argument, or the one input), its bounds), each [batch, K]: its
  outputs flattened and concatenated in order."""
  if not isinstance(inputs, dict):
    inputs = {"x": inputs}
  keys = list(inputs)
  arrays = [np.asarray(inputs[k]) for k in keys]

  def outputs(run, layer, *rows):
    *rows, _ = rows
    return _layer_outputs(run, layer, dict(zip(keys, rows)))

  width = max(int(np.prod(a.shape[1:-1] or (1,))) for a in arrays)
  return _bounds(layer, arrays, outputs, precision, None, width * width)


def affine(run, x, kernel, bias):
  """x W + b (a Keras `Dense` layer's), its roundings on `run`."""
  return _affine(run, x, named_weights.Affine(_numpy(kernel), _numpy(bias)),
                 f"dense_{len(run.points)}")


def flat(tensor):
  """A reference's [rows, ...] tensor as [rows, K]."""
  return tf.reshape(tensor, [tf.shape(tensor)[0], -1])


def custom_bounds(model, arrays, outputs, precision=FLOAT32, size=1):
  """`bounds` of any composition: `outputs(run, model, *rows, index)`
  ([rows, K], from `layer_call`s and `run.store` on `run`) of the
  row-aligned `arrays`; `size`: what a row costs a pass (`PASS_SIZE`)."""
  return _bounds(model, [np.asarray(a) for a in arrays], outputs, precision,
                 None, size)


def vocabulary_logit_bounds(model, sources, prefixes, precision=FLOAT32):
  """(exact logits [rows, vocab] of the next token after each prefix (id
  lists, BOS left out) given its source, their bounds), for every logit of
  a large vocabulary at the cost of d_model gradient rows, not vocab:

  z_v = h . E_v + b_v, so |error of z_v| <= ||E_v|| ||error of h|| + the
  projection's own roundings (d_model + 2 of at most u (|h| |E_v| + |b_v|),
  the weight's one among them). Each component h_i is within LAMBDA_D times
  the root of its sum of squares (`bounds`), LAMBDA_D taking the failure
  chance over the d_model components together, so ||error of h|| is within
  LAMBDA_D times the root of their total: every logit's bound holds at
  once but with probability FAILURE. Cauchy-Schwarz costs up to
  sqrt(d_model) against the logits' own sums of squares."""
  weights = _weights(_members(model)[0])
  source = _padded(sources)
  target_in = _padded([[BOS_ID] + list(p) for p in prefixes])
  last = tf.constant([len(p) for p in prefixes], tf.int32)

  def outputs(run, model, source, target_in, index):
    h, _ = forward(run, _weights(_members(model)[0]), source, target_in,
                   logits="hidden")
    return tf.gather(h, tf.gather(last, index), batch_dims=1)

  # A prefix may hold PAD itself (a padded batch's every position): `trim`
  # would then cut the position that `last` reads.
  hidden, bound = bounds(model, source, target_in, outputs, precision,
                         trim=not any(PAD_ID in p for p in prefixes))
  d_model = hidden.shape[1]
  lambda_d = math.sqrt(2 * math.log(2 * d_model / FAILURE))
  error = lambda_d / LAMBDA * np.sqrt(np.sum(bound**2, 1))  # ||error of h||
  e = np.asarray(weights.output_embedding)
  bias = (np.zeros(e.shape[0]) if weights.output_bias is None else
          np.asarray(weights.output_bias))
  logits = hidden @ e.T + bias
  magnitude = np.abs(hidden) @ np.abs(e.T) + np.abs(bias)
  own = LAMBDA * math.sqrt(d_model + 2) * U32 * magnitude
  return logits, error[:, None] * np.linalg.norm(e, axis=1)[None] + own


def vocabulary_log_prob_bounds(model, sources, prefixes, precision=FLOAT32):
  """(exact log-probabilities [rows, vocab] of the next token after each
  prefix, their bounds), from `vocabulary_logit_bounds`: log_softmax moves
  a log-probability by its logit's error and the log-sum-exp's, which is
  at most the largest logit's error; then its own float32 roundings (V
  exponentials within FUNCTION u, their sum, its log, the difference)."""
  logits, bound = vocabulary_logit_bounds(model, sources, prefixes,
                                          precision)
  top = logits.max(-1, keepdims=True)
  lse = top + np.log(np.exp(logits - top).sum(-1, keepdims=True))
  log_probs = logits - lse
  vocab = logits.shape[-1]
  own = LAMBDA * math.sqrt(FUNCTION**2 * vocab + vocab + FUNCTION**2 + 1) * (
      U32 * np.maximum(np.abs(lse - top), 1.0)) + U32 * np.abs(log_probs)
  return log_probs, bound + bound.max(-1, keepdims=True) + own


def exact_next_log_probs(model, sources, prefixes, epsilon=None):
  """float64 log-probabilities [rows, vocab] of the next token after each
  prefix, exactly (float64) from `model`'s weights; with another layer
  norm `epsilon`, of that other function (Transformers' MarianMTModel
  adds 1e-5 to the variance, ours 1e-6): what a comparison with another
  engine must allow besides both's rounding."""
  weights = _weights(model)
  if epsilon is not None:
    weights = weights._replace(epsilon=epsilon)
  run = _Pass(None, FLOAT32)
  logits, _ = forward(run, weights, _padded(sources),
                      _padded([[BOS_ID] + list(p) for p in prefixes]))
  log_probs = log_softmax(run, logits)
  return tf.gather(log_probs, [len(p) for p in prefixes],
                   batch_dims=1).numpy()


def exact_token_log_probs(model, sources, targets, epsilon=None):
  """float64 log P of each target token [rows, T] (0 past its end), exactly,
  of `model`'s function with its layer norms' `epsilon` (its own, or
  another engine's: `exact_next_log_probs`)."""
  weights = _weights(model)
  if epsilon is not None:
    weights = weights._replace(epsilon=epsilon)
  run = _Pass(None, FLOAT32)
  target_in = _padded([[BOS_ID] + list(t[:-1]) if len(t) else [BOS_ID]
                       for t in targets])
  target_out = _padded([list(t) for t in targets], target_in.shape[1])
  logits, _ = forward(run, weights, _padded(sources), target_in)
  picked = tf.gather(log_softmax(run, logits), target_out, batch_dims=2)
  return picked.numpy() * (target_out != PAD_ID)
