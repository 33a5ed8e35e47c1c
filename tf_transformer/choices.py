"""The values the package's options take, importable without TensorFlow.

The modules that act on these values (the search, the ensemble, the export,
the distribution strategy) import them from here, and the bin/ commands'
flags list them, so that a command checks its flags, and answers --help,
before TensorFlow loads (about 5 s; `tf_transformer.command`).
"""

# A corpus's splits (bin/prepare_data.py --write_text).
SPLITS = ("train", "dev", "test")

# The searches (section 6.1's beam search; greedy; sampling).
METHODS = ("beam", "greedy", "sample")

# The bounds of the searches' numeric settings (DecodingOptions' fields, and
# the bin/ commands' flags of the same names): name -> (test, why). One
# table, so that a flag is refused before TensorFlow loads in the words that
# DecodingOptions would use.
DECODING_BOUNDS = {
    "temperature": (lambda t: t > 0, "must be > 0"),
    "top_k": (lambda k: k >= 0, "must be >= 0 (0 = whole vocabulary)"),
    "top_p": (lambda p: 0 < p <= 1, "must be in (0, 1] (1 = whole "
              "vocabulary)"),
    "num_samples": (lambda n: n >= 1, "must be >= 1"),
    "min_length": (lambda n: n >= 0, "must be >= 0 (0 = none)"),
    "no_repeat_ngram_size": (lambda n: n == 0 or n >= 2, "must be 0 (off) "
                             "or >= 2 (1 would ban every token output "
                             "before)"),
}


def check_decoding(**values):
  """Raises ValueError naming the first setting out of DECODING_BOUNDS."""
  for name, value in values.items():
    test, why = DECODING_BOUNDS[name]
    if not test(value):
      raise ValueError(f"{name}={value}: {why}")


# How an ensemble combines its members' next-token distributions.
AVERAGES = ("log_probs", "probs")

# What an export's weights and matmuls may be (bin/export.py --dtype).
DTYPES = ("float32", "bfloat16")

# The tf.distribute strategies a run may train under (bin/train.py).
DISTRIBUTIONS = ("one_device", "mirrored", "multi_worker")

# Why a shortlist and XLA do not go together (one rule, said once).
XLA_WITH_SHORTLIST = ("--shortlist with --xla: a shortlist's size varies by "
                      "request, which XLA would compile anew; choose one")

# Why --alignment_layer is an option of CTranslate2 exports only.
ALIGNMENT_LAYER_WITH_SAVED_MODEL = (
    "--alignment_layer: only with --format=ctranslate2, which keeps one "
    "decoder layer's attention; a SavedModel keeps every layer's (choose one "
    "with translate.py --alignment_layer)")

# The student of bin/main_job.py --student (run/student_job.py): its shape
# over the teacher's, its encoder (run once a sentence) and one decoder
# layer (run once an output token); and its export's shortlist, K candidates
# a source piece and the N most frequent pieces, over bfloat16 weights.
STUDENT_HPARAMS = "num_decoder_layers=1"
STUDENT_SHORTLIST = (50, 300)
