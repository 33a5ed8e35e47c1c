#!/usr/bin/env python3
"""`tf-transformer-train` run from a clone; tf_transformer/cli/train.py
says what it does."""

from tf_transformer.cli import train

if __name__ == "__main__":
  train.run()
