#!/usr/bin/env python3
r"""Translates one sentence and writes PNG heatmaps of the attention of
chosen layers and heads, like the paper's Figures 3 to 5.

  bin/plot_attention.py --model=saved_models/numbers/1 \
      --sentence="four hundred and twenty-one" --kind=encoder_decoder \
      --layers=2 --heads=1,2 --output_dir=/tmp/attention

Writes OUTPUT_DIR/KIND_layerL_headH.png (layers and heads count from 1, as
in the paper's "layer 5 of 6"), one per kind, layer and head. The weights
come from the export's `attention` signature (--model) or the same graph
code run on a checkpoint (--model_dir): a teacher-forced pass over the
best translation. Needs matplotlib (pip install "tf_transformer[plot]").
"""

import os
import sys

from absl import app
from absl import flags

from tf_transformer import command
from tf_transformer import plots

FLAGS = flags.FLAGS
KINDS = ("encoder_self", "decoder_self", "encoder_decoder")
flags.DEFINE_string("model", None, "An exported SavedModel (NAME/VERSION).")
flags.DEFINE_string("model_dir", None, "Or a training run / averaged model.")
flags.DEFINE_string("sentence", None, "The source sentence.")
flags.DEFINE_list("kind", ["encoder_decoder"], f"Any of {', '.join(KINDS)}.")
flags.DEFINE_string("layers", "last", "Comma-separated layers from 1, "
                    "'last' or 'all'.")
flags.DEFINE_string("heads", "all", "Comma-separated heads from 1, or 'all'.")
flags.DEFINE_string("output_dir", None, "Where the PNG files go.")
flags.mark_flags_as_required(["sentence", "output_dir"])
flags.register_validator("kind", lambda kinds: set(kinds) <= set(KINDS),
                         f"--kind: each must be one of {', '.join(KINDS)}")


def _attention(sentence):
  """The attention signature's outputs for one sentence, as numpy."""
  import tensorflow as tf  # pylint: disable=g-import-not-at-top
  if bool(FLAGS.model) == bool(FLAGS.model_dir):
    raise app.UsageError("pass exactly one of --model and --model_dir")
  if FLAGS.model:
    import tensorflow_text  # noqa: F401  pylint: disable=unused-import,g-import-not-at-top
    attention = tf.saved_model.load(FLAGS.model).signatures["attention"]
  else:
    from tf_transformer.run import loading  # pylint: disable=g-import-not-at-top
    module = loading.translation_module(FLAGS.model_dir)
    attention = module.attention  # (the tf.function holds `module` weakly)
  out = attention(text=tf.constant([sentence]))
  return {key: value.numpy()[0] for key, value in out.items()}


def _choose(spec, count, flag):
  """'all', 'last' or '1,3' -> 0-based indices, or a UsageError."""
  if spec == "all":
    return list(range(count))
  if spec == "last":
    return [count - 1]
  try:
    chosen = [int(part) - 1 for part in spec.split(",")]
  except ValueError:
    chosen = [-1]
  if not all(0 <= i < count for i in chosen):
    raise app.UsageError(f"--{flag}={spec}: the model has {count} {flag}, "
                         f"numbered 1 to {count}")
  return chosen


def _tokens(pieces):
  return [p.decode("utf-8", "replace") for p in pieces if p]


def main(argv):
  del argv
  try:
    out = _attention(FLAGS.sentence)
  except (OSError, ValueError) as e:
    print(f"plot_attention: error: {e}", file=sys.stderr)
    return 1
  source, target = _tokens(out["source_tokens"]), _tokens(out["target_tokens"])
  axes = {"encoder_self": (source, source), "decoder_self": (target, target),
          "encoder_decoder": (target, source)}
  num_layers, num_heads = out["encoder_self"].shape[:2]
  layers = _choose(FLAGS.layers, num_layers, "layers")
  heads = _choose(FLAGS.heads, num_heads, "heads")
  os.makedirs(FLAGS.output_dir, exist_ok=True)
  print(f"translation: {out['translation'].decode('utf-8', 'replace')}")
  for kind in FLAGS.kind:
    rows, columns = axes[kind]
    for layer in layers:
      for head in heads:
        name = f"{kind}_layer{layer + 1}_head{head + 1}.png"
        weights = out[kind][layer, head, :len(rows), :len(columns)]
        path = plots.attention_heatmap(
            weights, rows, columns,
            f"{kind}, layer {layer + 1} of {num_layers}, head {head + 1}",
            os.path.join(FLAGS.output_dir, name))
        print(path)
  return 0


if __name__ == "__main__":
  command.run(main)
