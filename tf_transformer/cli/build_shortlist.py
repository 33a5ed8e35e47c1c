r"""Builds a run's vocabulary shortlist table from its training pairs
(`tf_transformer/data/shortlist_table.py`: the target pieces of highest
Dice co-occurrence with each source piece, and the most frequent target
pieces), as MODEL_DIR/shortlist.npz, for bin/export.py --shortlist=K,N and
bin/translate.py / bin/evaluate.py --model_dir=RUN --shortlist=K,N.

  bin/build_shortlist.py --model_dir=/tmp/multi30k/run

Reads the token arrays that preparation or training left in the run
(tokenizing the training data now where there are none).
"""


from absl import flags

from tf_transformer import command
from tf_transformer.data.errors import DataError

FLAGS = flags.FLAGS
flags.DEFINE_string("model_dir", None, "The training run (its data_spec.json "
                    "and vocabulary.model say what to count).")
flags.DEFINE_integer("k_max", 50, "Candidates kept a source piece: the "
                     "most --shortlist=K can take.", lower_bound=1)
flags.DEFINE_integer("n_max", 1000, "Frequent target pieces kept: the most "
                     "--shortlist=K,N can take.", lower_bound=0)
flags.DEFINE_integer("max_pairs", 1_000_000, "Training pairs counted at "
                     "most, spread evenly over the corpus.", lower_bound=1)
flags.mark_flag_as_required("model_dir")


def main(argv):
  del argv
  from tf_transformer.run.runner import Runner  # pylint: disable=g-import-not-at-top
  try:
    table, path = Runner(FLAGS.model_dir).build_shortlist(
        FLAGS.k_max, FLAGS.n_max, FLAGS.max_pairs)
  except (DataError, FileNotFoundError) as e:
    return command.fail("build_shortlist", e, 2)
  with_candidates = int((table.candidates[:, 0] >= 0).sum())
  print(f"counted {table.pairs:,} pairs: candidates for {with_candidates:,} "
        f"of {len(table.candidates):,} pieces, {len(table.frequent):,} "
        "frequent pieces")
  print(f"wrote {path}")
  return 0


def run():
  """`tf-transformer-build-shortlist`: parses the flags, then runs `main`."""
  command.run(main)
