#!/usr/bin/env python3
"""`tf-transformer-average-checkpoints` run from a clone; tf_transformer/cli/average_checkpoints.py
says what it does."""

from tf_transformer.cli import average_checkpoints

if __name__ == "__main__":
  average_checkpoints.run()
