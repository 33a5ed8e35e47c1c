#!/usr/bin/env python3
"""`tf-transformer-evaluate` run from a clone; tf_transformer/cli/evaluate.py
says what it does."""

from tf_transformer.cli import evaluate

if __name__ == "__main__":
  evaluate.run()
