r"""Translates one sentence and writes PNG heatmaps of the attention of
chosen layers and heads, like the paper's Figures 3 to 5.

  bin/plot_attention.py --model=saved_models/numbers/1 \
      --sentence="four hundred and twenty-one" --kind=encoder_decoder \
      --layers=2 --heads=1,2 --output_dir=/tmp/attention

Writes OUTPUT_DIR/KIND_layerL_headH.png (layers and heads count from 1, as
in the paper's "layer 5 of 6"), one per kind, layer and head. The weights
come from the export's `attention` signature, or from the same graph code
run on a run's checkpoint (--model=RUN or --model_dir): a teacher-forced
pass over the best translation.
"""


from absl import flags

from tf_transformer import command
from tf_transformer import plots

FLAGS = flags.FLAGS
KINDS = plots.KINDS
flags.DEFINE_string("model", None, "A SavedModel version (NAME/VERSION) "
                    "or a run directory; told apart by their files.")
flags.DEFINE_string("model_dir", None, "Or a run: a training run or "
                    "averaged model.")
flags.DEFINE_string("sentence", None, "The source sentence.")
flags.DEFINE_list("kind", ["encoder_decoder"], f"Any of {', '.join(KINDS)}.")
flags.DEFINE_string("layers", "last", "Comma-separated layers from 1, "
                    "'last' or 'all'.")
flags.DEFINE_string("heads", "all", "Comma-separated heads from 1, or 'all'.")
flags.DEFINE_string("output_dir", None, "Where the PNG files go.")
flags.mark_flags_as_required(["sentence", "output_dir"])
flags.register_validator("kind", lambda kinds: set(kinds) <= set(KINDS),
                         f"--kind: each must be one of {', '.join(KINDS)}")


def main(argv):
  del argv
  from tf_transformer.run import runner  # pylint: disable=g-import-not-at-top
  try:
    out = runner.attention(FLAGS.sentence, FLAGS.model, FLAGS.model_dir)
    stack = lambda kind: "the encoder" if kind == "encoder_self" else (
        "the decoder")
    layers = {kind: plots.choose(FLAGS.layers, out[kind].shape[0], "layers",
                                 stack(kind))
              for kind in FLAGS.kind}
    heads = plots.choose(FLAGS.heads, out["encoder_self"].shape[1], "heads")
  except (OSError, ValueError) as e:
    return command.fail("plot_attention", e, 1)
  print(f"translation: {out['translation'].decode('utf-8', 'replace')}")
  for path in plots.attention_heatmaps(out, FLAGS.kind, layers, heads,
                                       FLAGS.output_dir):
    print(path)
  return 0


def run():
  """`tf-transformer-plot-attention`: parses the flags, then runs `main`."""
  command.run(main)
