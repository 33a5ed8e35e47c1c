#!/usr/bin/env python3
"""`tf-transformer-plot-attention` run from a clone; tf_transformer/cli/plot_attention.py
says what it does."""

from tf_transformer.cli import plot_attention

if __name__ == "__main__":
  plot_attention.run()
