#!/usr/bin/env python3
"""`tf-transformer-serving-client` run from a clone; tf_transformer/cli/serving_client.py
says what it does."""

from tf_transformer.cli import serving_client

if __name__ == "__main__":
  serving_client.run()
