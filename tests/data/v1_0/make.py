"""Writes tests/data/v1_0/ with release 1.0.0's code (commit 9549417, on
PYTHONPATH): a model directory (config, vocabulary, an averaged checkpoint)
of a tiny numbers run and its `.keras` file, with what 1.0.0 computed from
them (logits, greedy and beam translations with their scores).

  git worktree add /tmp/v1_0 9549417
  cd /tmp && PYTHONPATH=/tmp/v1_0 python REPO/tests/data/v1_0/make.py OUT
"""
import os, shutil, sys
import numpy as np
import keras
from tf_transformer import get_config
from tf_transformer.data.sources import DataSpec
from tf_transformer.run import run_dir
from tf_transformer.run.runner import Runner, open_translator

out = sys.argv[1]
work = out + "_work"
shutil.rmtree(work, ignore_errors=True)
spec = DataSpec(dataset="numbers", numbers_train_size=2000, seed=0)
config = get_config("tiny", "num_layers=1,d_model=32,d_ff=64,num_heads=2,"
                    "dropout_rate=0.0", train_steps=300, batch_tokens=512)
runner = Runner(work)
runner.train(config, spec, vocab_size=300, max_length=32,
             eval_every_steps=0, checkpoint_every_secs=0,
             keep_checkpoints=1, xla_loss=False)
runner.average(1, out + "/run")  # a model directory: config, vocabulary, weights
model, vocabulary = run_dir.load_trained_model(out + "/run")
model.save(out + "/model.keras")
source = np.array([[5, 6, 7, 3, 0], [8, 9, 10, 11, 3]], np.int32)
target = np.array([[2, 5, 6, 0], [2, 7, 8, 9]], np.int32)
texts = ["seven hundred and twelve", "forty-two", "three thousand and five",
         "ninety-nine", "one hundred"]
greedy = open_translator(model_dir=out + "/run", method="greedy").translate(texts)
beam = open_translator(model_dir=out + "/run").translate(texts)
print(greedy, beam)
np.savez(out + "/outputs.npz", source=source, target=target,
         logits=keras.ops.convert_to_numpy(model((source, target))),
         texts=np.array(texts), greedy=np.array([h[0][0] for h in greedy]),
         greedy_scores=np.array([h[0][1] for h in greedy], np.float32),
         beam=np.array([h[0][0] for h in beam]),
         beam_scores=np.array([h[0][1] for h in beam], np.float32))
shutil.rmtree(work)
