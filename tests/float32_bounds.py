"""How far two float32 computations of one model may be apart: the bounds of
the suite's comparisons between two paths through the same weights.

Two paths (the export's `score` signature and the Keras model's teacher
forcing; the cached step and the full pass; a batch of one and a batch of
24; an export and the run it came from; TensorFlow and another engine) run
different kernels. oneDNN and Eigen pick each kernel, and with it the order
in which a dot product's terms are summed, by the CPU's instructions (AVX2
on Zen 3; AVX-512 on Zen 4, Zen 5 and Xeon, whose AMX tiles serve bfloat16
and int8 only, never these float32 dots) and by the tensors' shapes; a graph
fuses ops (a matmul with its bias and activation) that eager calls run
apart. One sum of n float32 terms, rounded in another order, moves by up to
(n - 1) * U of the sum of the terms' magnitudes (Higham, "Accuracy and
Stability of Numerical Algorithms", 2002, section 4.2), where U = 2**-24 is
float32's unit roundoff; rounding of that kind, layer after layer (sums of
d_model = 64 and d_ff = 256 terms, softmaxes, layer norms that divide by a
standard deviation), is what parts two paths.

A log-probability is a difference of logits (log_softmax), so it moves by at
most twice the largest change of a logit, and a logit moves relative to the
logits' magnitude: about 10 in the suite's trained numbers model (below 4 in
its untrained ones). Measured on that trained model's 408 tokens
(conftest.trained_numbers_run; tests/test_score.py's pairs), the largest
change of a token's log-probability between two paths, on 2 cores of an AMD
EPYC family 25 model 17 (Zen 4), with oneDNN held to each kernel family
(ONEDNN_MAX_CPU_ISA) and with oneDNN off (Eigen's kernels), was:

    kernels          export vs eager    graph vs eager    1 row vs 48 rows
    AVX-512 (host)   1.81e-5            1.16e-5           4.1e-6
    AVX2             1.24e-5            4.4e-6            8.3e-6
    SSE4.1           1.05e-5            6.7e-6            8.8e-6
    Eigen            4.2e-6             7.3e-6            4.8e-6

(AMD Zen 5 gave the AVX-512 row's 1.81e-5 exactly: the same kernels.) That
is 1.8e-6 of the logits' magnitude, 30 U; between our random Marian models
and Transformers' (PyTorch's kernels), 1.0e-6 (5.2e-6 at logits of 5.4).
RELATIVE is 5.5 times the largest share, LOG_PROB its bound at logits of 10.
What the comparisons are there to catch moves log-probabilities by far more:
on the trained model, reading each sentence's log-probabilities one position
off moves one of them by 0.08 at least (5.3 the median sentence), and
another pair's target moves a sentence's log P by tens of nats
(tests/test_score.py asserts both).
"""

import numpy as np

U = float(np.finfo(np.float32).eps) / 2  # 2**-24: float32's unit roundoff

# Two paths' log-probabilities of one token, or their logits, as a share of
# the logits' largest magnitude (module docstring).
RELATIVE = 1e-5
# The same for the suite's models, whose logits are of magnitude up to
# about 10.
LOG_PROB = 10 * RELATIVE


def log_prob_bound(logits):
  """RELATIVE of the largest magnitude among `logits` (an array)."""
  return RELATIVE * float(np.max(np.abs(logits)))


def sentence(tokens):
  """Two paths' sums of `tokens` log-probabilities (a sentence's log P, or
  a search's score before or after its length penalty, which is at least 1):
  each token within LOG_PROB, so the sum within `tokens` times it."""
  return int(tokens) * LOG_PROB


# Two paths' attention weights (probabilities): a change d of the scores
# moves a weight w by at most 2 * w * max|d|, and the scores, q.k / sqrt(d_k)
# over d_k = 16 terms, move less than the logits. The largest change measured
# as above, between the export's `forced_alignment` and the Keras model's
# attention_weights, was 4.5e-7 (AVX2; 3.6e-7 AVX-512, 4.2e-7 SSE4.1, 3.3e-7
# Eigen), and CTranslate2's against ours 3.0e-7: ATTENTION is 22 times the
# largest.
ATTENTION = 1e-5

# One set of float32 numbers summed in two orders (NumPy's pairwise sum and
# TensorFlow's reduction): each order within (n - 1) * U of the sum of the
# terms' magnitudes (Higham 2002, section 4.2), for up to 64 terms. Relative
# to the sum itself where the terms have one sign (log-probabilities).
SUM_RTOL = 2 * 63 * U
