"""Attention heatmaps, drawn as the paper's Figures 3 to 5: the rows (the
queries' tokens) attending to the columns (the keys' tokens), tokens on the
axes. `attention_heatmap` writes one head of one layer as a PNG file
(bin/plot_attention.py); `layer_image` draws one layer with all its heads
as PNG bytes, which the training summaries show in TensorBoard.

matplotlib, the field's standard plotting library (and the one TensorFlow's
TensorBoard image guide draws figures with), draws them; it is imported
only here.
"""

import io
import math
import os

import numpy as np

# Inches a token takes on an axis; 8-point labels at 100 dpi, readable in
# TensorBoard without zooming.
_INCHES_PER_TOKEN = 0.17
_TICK_POINTS = 8
_PAD_INCHES = 0.15  # between a label and the next thing
_TITLE_INCHES = 0.3
_COLORBAR_INCHES = 0.8
_DPI = 100
HEADS_PER_ROW = 2


def _figure(width, height, layout="constrained"):
  """A Figure without pyplot: no global state, no display, thread-safe.
  Constrained layout keeps a heatmap's labels and colour bar inside it;
  `layout=None` leaves the axes where the caller puts them."""
  from matplotlib.figure import Figure  # pylint: disable=g-import-not-at-top
  return Figure(figsize=(width, height), dpi=_DPI, layout=layout)


def _check(weights, row_tokens, column_tokens):
  weights = np.asarray(weights, dtype=np.float32)
  if weights.shape != (len(row_tokens), len(column_tokens)):
    raise ValueError(f"weights {weights.shape} do not match "
                     f"{len(row_tokens)} x {len(column_tokens)} tokens")
  return weights


def _draw(axes, weights, row_tokens, column_tokens, title, row_labels=True):
  """One head's heatmap on `axes`, values 0 to 1 on one colour scale."""
  image = axes.imshow(weights, cmap="viridis", vmin=0.0, vmax=1.0,
                      aspect="equal")
  axes.set_xticks(range(len(column_tokens)), column_tokens, rotation=90,
                  fontsize=_TICK_POINTS)
  axes.set_yticks(range(len(row_tokens)),
                  row_tokens if row_labels else [""] * len(row_tokens),
                  fontsize=_TICK_POINTS)
  axes.set_title(title, fontsize=9)
  return image


def attention_heatmap(weights, row_tokens, column_tokens, title, path):
  """Writes `weights` [rows, columns] (each row a distribution over the
  columns) as a heatmap PNG at `path`."""
  weights = _check(weights, row_tokens, column_tokens)
  size = 2.5 + 0.35 * max(len(row_tokens), len(column_tokens))
  figure = _figure(size, size)
  axes = figure.subplots()
  image = _draw(axes, weights, row_tokens, column_tokens, title)
  figure.colorbar(image, ax=axes, fraction=0.046, pad=0.04)
  figure.savefig(path, dpi=_DPI)
  return path


def _label_inches(labels):
  """The width of the widest tick label, in inches (font metrics: no
  drawing)."""
  from matplotlib.font_manager import FontProperties  # pylint: disable=g-import-not-at-top
  from matplotlib.textpath import TextToPath  # pylint: disable=g-import-not-at-top
  font, measure = FontProperties(size=_TICK_POINTS), TextToPath()
  return max(measure.get_text_width_height_descent(label, font, False)[0]
             for label in labels) / 72


def layer_image(heads, row_tokens, column_tokens, title):
  """PNG bytes of one layer's attention, [heads, rows, columns], one panel
  a head (up to `HEADS_PER_ROW` a row), the tokens on every panel's axes
  and one colour scale from 0 to 1. The margins come from the labels'
  font metrics, not from a layout engine, which draws every label several
  times to measure it."""
  heads = np.asarray(heads, dtype=np.float32)
  for head in heads:
    _check(head, row_tokens, column_tokens)
  columns = min(len(heads), HEADS_PER_ROW)
  rows = math.ceil(len(heads) / columns)
  # Inches: the row tokens' margin (on the left; further panels of a row
  # leave their labels off), a panel's heatmap, the space over it for its
  # title and under it for the column tokens (turned 90 degrees), and the
  # figure's title and colour bar.
  left = _label_inches(row_tokens) + _PAD_INCHES
  bottom = _label_inches(column_tokens) + _PAD_INCHES
  panel_width = _INCHES_PER_TOKEN * len(column_tokens)
  panel_height = _INCHES_PER_TOKEN * len(row_tokens)
  gap = 2 * _PAD_INCHES
  row_height = _TITLE_INCHES + panel_height + bottom
  width = left + columns * (panel_width + gap) + _COLORBAR_INCHES
  height = _TITLE_INCHES + rows * row_height
  figure = _figure(width, height, layout=None)
  for index, head in enumerate(heads):
    row, column = divmod(index, columns)
    top = _TITLE_INCHES + row * row_height + _TITLE_INCHES
    axes = figure.add_axes([(left + column * (panel_width + gap)) / width,
                            1 - (top + panel_height) / height,
                            panel_width / width, panel_height / height])
    image = _draw(axes, head, row_tokens, column_tokens, f"head {index + 1}",
                  row_labels=column == 0)
  figure.suptitle(title, fontsize=10, y=1 - 0.1 / height, va="top")
  # The colour bar beside the panels, centred on them, at most 2 inches.
  span_top = 2 * _TITLE_INCHES
  span = (rows - 1) * row_height + panel_height
  bar = min(2.0, span)
  colorbar = figure.add_axes([
      (left + columns * (panel_width + gap)) / width,
      1 - (span_top + (span + bar) / 2) / height, 0.12 / width,
      bar / height])
  figure.colorbar(image, cax=colorbar)
  buffer = io.BytesIO()
  figure.savefig(buffer, format="png", dpi=_DPI)
  return buffer.getvalue()


KINDS = ("encoder_self", "decoder_self", "encoder_decoder")


def choose(spec, count, what, whose="the model"):
  """0-based indices of `spec`, a flag's value in the paper's counting from
  1: 'all', 'last' or '1,3'. ValueError names the flag `what` and `whose`
  `count` of them (the model's, or one stack's)."""
  if spec == "all":
    return list(range(count))
  if spec == "last":
    return [count - 1]
  try:
    chosen = [int(part) - 1 for part in spec.split(",")]
  except ValueError:
    chosen = [-1]
  if not all(0 <= i < count for i in chosen):
    raise ValueError(f"--{what}={spec}: {whose} has {count} {what}, "
                     f"numbered 1 to {count}")
  return chosen


def tokens(pieces):
  """Subword pieces (bytes or str, "" as padding) as labels."""
  return [p.decode("utf-8", "replace") if isinstance(p, bytes) else p
          for p in pieces if p]


def axes_tokens(kind, source_tokens, target_tokens):
  """(row tokens, column tokens) of one kind of attention: queries and keys
  are the source's for the encoder, the target's for the decoder (rows
  labelled by the token each position outputs)."""
  return {"encoder_self": (source_tokens, source_tokens),
          "decoder_self": (target_tokens, target_tokens),
          "encoder_decoder": (target_tokens, source_tokens)}[kind]


def attention_heatmaps(attention, kinds, layers, heads, output_dir):
  """Writes OUTPUT_DIR/KIND_layerL_headH.png (counted from 1, as in the
  paper's "layer 5 of 6") for each kind, layer and head (0-based indices)
  of one sentence's `attention` (the `attention` function's outputs:
  source_tokens, target_tokens and [layers, heads, rows, columns] weights
  per kind); `layers` maps each kind to its layers, as the encoder and the
  decoder may differ in depth. Returns the paths."""
  source = tokens(attention["source_tokens"])
  target = tokens(attention["target_tokens"])
  os.makedirs(output_dir, exist_ok=True)
  paths = []
  for kind in kinds:
    rows, columns = axes_tokens(kind, source, target)
    num_layers = attention[kind].shape[0]
    for layer in layers[kind]:
      for head in heads:
        paths.append(attention_heatmap(
            attention[kind][layer, head, :len(rows), :len(columns)], rows,
            columns,
            f"{kind}, layer {layer + 1} of {num_layers}, head {head + 1}",
            os.path.join(output_dir,
                         f"{kind}_layer{layer + 1}_head{head + 1}.png")))
  return paths
