#!/usr/bin/env python3
"""`tf-transformer-score` run from a clone; tf_transformer/cli/score.py
says what it does."""

from tf_transformer.cli import score

if __name__ == "__main__":
  score.run()
