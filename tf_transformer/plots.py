"""Attention heatmaps as PNG files, like the paper's Figures 3 to 5: one
head of one layer, the rows attending to the columns, tokens on the axes.

Needs matplotlib (pip install "tf_transformer[plot]"), the field's standard
plotting library; it is imported only here.
"""

import os

import numpy as np


def _pyplot():
  try:
    import matplotlib  # pylint: disable=g-import-not-at-top
  except ImportError as e:
    raise ImportError("plots need matplotlib: pip install "
                      "'tf_transformer[plot]'") from e
  matplotlib.use("Agg")  # files only, no display
  import matplotlib.pyplot as plt  # pylint: disable=g-import-not-at-top
  return plt


def attention_heatmap(weights, row_tokens, column_tokens, title, path):
  """Writes `weights` [rows, columns] (each row a distribution over the
  columns) as a heatmap PNG at `path`."""
  weights = np.asarray(weights)
  if weights.shape != (len(row_tokens), len(column_tokens)):
    raise ValueError(f"weights {weights.shape} do not match "
                     f"{len(row_tokens)} x {len(column_tokens)} tokens")
  plt = _pyplot()
  size = 2.5 + 0.35 * max(len(row_tokens), len(column_tokens))
  figure, axes = plt.subplots(figsize=(size, size))
  image = axes.imshow(weights, cmap="viridis", vmin=0.0, vmax=1.0)
  axes.set_xticks(range(len(column_tokens)), column_tokens, rotation=90)
  axes.set_yticks(range(len(row_tokens)), row_tokens)
  axes.set_title(title)
  figure.colorbar(image, ax=axes, fraction=0.046, pad=0.04)
  figure.tight_layout()
  figure.savefig(path, dpi=100)
  plt.close(figure)
  return path


KINDS = ("encoder_self", "decoder_self", "encoder_decoder")


def choose(spec, count, what):
  """0-based indices of `spec`, a flag's value in the paper's counting from
  1: 'all', 'last' or '1,3'. ValueError names the flag `what` and the
  model's `count` of them."""
  if spec == "all":
    return list(range(count))
  if spec == "last":
    return [count - 1]
  try:
    chosen = [int(part) - 1 for part in spec.split(",")]
  except ValueError:
    chosen = [-1]
  if not all(0 <= i < count for i in chosen):
    raise ValueError(f"--{what}={spec}: the model has {count} {what}, "
                     f"numbered 1 to {count}")
  return chosen


def _tokens(pieces):
  return [p.decode("utf-8", "replace") if isinstance(p, bytes) else p
          for p in pieces if p]


def attention_heatmaps(attention, kinds, layers, heads, output_dir):
  """Writes OUTPUT_DIR/KIND_layerL_headH.png (counted from 1, as in the
  paper's "layer 5 of 6") for each kind, layer and head (0-based indices)
  of one sentence's `attention` (the `attention` function's outputs:
  source_tokens, target_tokens and [layers, heads, rows, columns] weights
  per kind); returns the paths."""
  source = _tokens(attention["source_tokens"])
  target = _tokens(attention["target_tokens"])
  axes = {"encoder_self": (source, source), "decoder_self": (target, target),
          "encoder_decoder": (target, source)}
  num_layers = attention["encoder_self"].shape[0]
  os.makedirs(output_dir, exist_ok=True)
  paths = []
  for kind in kinds:
    rows, columns = axes[kind]
    for layer in layers:
      for head in heads:
        paths.append(attention_heatmap(
            attention[kind][layer, head, :len(rows), :len(columns)], rows,
            columns,
            f"{kind}, layer {layer + 1} of {num_layers}, head {head + 1}",
            os.path.join(output_dir,
                         f"{kind}_layer{layer + 1}_head{head + 1}.png")))
  return paths
