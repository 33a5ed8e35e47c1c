#!/usr/bin/env python3
"""`tf-transformer-main-job` run from a clone; tf_transformer/cli/main_job.py
says what it does."""

from tf_transformer.cli import main_job

if __name__ == "__main__":
  main_job.run()
