#!/usr/bin/env python3
"""`tf-transformer-model-summary` run from a clone; tf_transformer/cli/model_summary.py
says what it does."""

from tf_transformer.cli import model_summary

if __name__ == "__main__":
  model_summary.run()
