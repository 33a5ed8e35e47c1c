"""Makes the OpenNMT-tf reference that the OpenNMT-tf import is tested
against: two tiny Transformers trained by OpenNMT-tf itself on a toy corpus,
their checkpoints (the last and the average OpenNMT-tf made), the
vocabulary file and the SentencePiece model its pieces came from, and what
OpenNMT-tf computes with them (per-token log-probabilities of given pairs,
greedy translations of raw text).

Run once, by hand, in the pinned reference environment (not CI's: OpenNMT-tf
needs TensorFlow <= 2.13 and tensorflow-addons):

  python3.11 -m venv /tmp/onmt
  /tmp/onmt/bin/pip install tensorflow==2.13.1 tensorflow-addons==0.21.0 \
      OpenNMT-tf==2.32.0
  /tmp/onmt/bin/python tests/data/opennmt/make_reference.py

It rewrites tests/data/opennmt/{shared,three}/ and corpus/:
- MODEL/ckpt-*: the last checkpoint as OpenNMT-tf writes it (the model's
  variables under "model/...", and the optimizer's);
- MODEL/avg/ckpt-*: OpenNMT-tf's own average of the last 3 checkpoints;
- MODEL/reference.json: the model's options, and for the averaged
  checkpoint each test pair's token log-probabilities (natural log, the
  target's pieces then </s>, from `onmt-main score` with_token_level) and
  each test source's greedy translation in pieces (`onmt-main infer`,
  beam 1);
- corpus/: the toy corpus as text and as pieces (`*.pieces`, cut offline by
  the SentencePiece model `sp.model`, as OpenNMT-tf's users do), and the
  OpenNMT vocabulary `onmt.vocab` (`onmt-build-vocab --from_format
  sentencepiece`: <blank>, <s>, </s>, then the pieces; OpenNMT-tf adds the
  out-of-vocabulary row last).

The models: `shared` is pre-norm with one embedding matrix for source,
target and output (EmbeddingsSharingLevel.ALL) and ReLU; `three` is pre-norm
with three matrices and GELU in its tanh form (`opennmt.layers.gelu`).
"""

import json
import os
import random
import shutil
import subprocess
import sys

import opennmt
import tensorflow as tf

HERE = os.path.dirname(os.path.abspath(__file__))
CORPUS = os.path.join(HERE, "corpus")
VERSIONS = {"tensorflow": "2.13.1", "opennmt": "2.32.0"}

# A toy language pair: each English word has one "German" word, and the
# target reverses the order, so the model must attend across positions.
WORDS = {"the": "der", "cat": "katze", "dog": "hund", "sat": "sass",
         "ran": "lief", "on": "auf", "mat": "matte", "park": "park",
         "green": "gruen", "big": "gross", "small": "klein", "red": "rot",
         "a": "ein", "in": "im", "house": "haus", "tree": "baum",
         "under": "unter", "blue": "blau", "bird": "vogel", "sings": "singt"}
OPTIONS = {
    "shared": dict(share_embeddings="ALL", activation="relu"),
    "three": dict(share_embeddings="NONE", activation="gelu_tanh"),
}
SIZES = dict(num_layers=2, num_units=32, num_heads=4, ffn_inner_dim=64)
STEPS, EVERY, AVERAGE = 600, 200, 3


def _pairs(count, seed):
  rng = random.Random(seed)
  english = sorted(WORDS)
  for _ in range(count):
    words = [rng.choice(english) for _ in range(rng.randint(2, 8))]
    yield " ".join(words), " ".join(WORDS[w] for w in reversed(words))


def _write_corpus():
  os.makedirs(CORPUS, exist_ok=True)
  for split, count, seed in (("train", 3000, 0), ("test", 20, 1)):
    pairs = list(_pairs(count, seed))
    for side, index in (("src", 0), ("tgt", 1)):
      with open(os.path.join(CORPUS, f"{split}.{side}"), "w") as f:
        f.writelines(pair[index] + "\n" for pair in pairs)
  # SentencePiece trained in a process of its own (with TensorFlow loaded,
  # its protobuf crashes the trainer); the corpus is cut into pieces offline,
  # as OpenNMT-tf users do with SentencePiece, and the vocabulary converted
  # by OpenNMT-tf's own tool.
  subprocess.run([sys.executable, "-c", f"""
import sentencepiece as spm
spm.SentencePieceTrainer.train(
    input=["{CORPUS}/train.src", "{CORPUS}/train.tgt"],
    model_prefix="{CORPUS}/sp", vocab_size=60, model_type="bpe",
    character_coverage=1.0, minloglevel=2)
processor = spm.SentencePieceProcessor(model_file="{CORPUS}/sp.model")
for split in ("train", "test"):
  for side in ("src", "tgt"):
    with open(f"{CORPUS}/{{split}}.{{side}}") as f:
      lines = f.read().splitlines()
    with open(f"{CORPUS}/{{split}}.{{side}}.pieces", "w") as f:
      f.writelines(" ".join(processor.encode(line, out_type=str)) + "\\n"
                   for line in lines)
"""], check=True)
  subprocess.run(
      [os.path.join(os.path.dirname(sys.executable), "onmt-build-vocab"),
       "--from_vocab", os.path.join(CORPUS, "sp.vocab"),
       "--from_format", "sentencepiece",
       "--save_vocab", os.path.join(CORPUS, "onmt.vocab")], check=True)


def _model(name):
  options = OPTIONS[name]
  activation = (opennmt.layers.gelu if options["activation"] == "gelu_tanh"
                else tf.nn.relu)
  return opennmt.models.Transformer(
      source_inputter=opennmt.inputters.WordEmbedder(SIZES["num_units"]),
      target_inputter=opennmt.inputters.WordEmbedder(SIZES["num_units"]),
      **SIZES, dropout=0.1, attention_dropout=0.1, ffn_dropout=0.1,
      ffn_activation=activation, pre_norm=True,
      share_embeddings=getattr(opennmt.models.EmbeddingsSharingLevel,
                               options["share_embeddings"]))


def _config(model_dir):
  vocabulary = os.path.join(CORPUS, "onmt.vocab")
  return {
      "model_dir": model_dir,
      "data": {
          "train_features_file": os.path.join(CORPUS, "train.src.pieces"),
          "train_labels_file": os.path.join(CORPUS, "train.tgt.pieces"),
          "source_vocabulary": vocabulary, "target_vocabulary": vocabulary},
      "params": {"optimizer": "Adam", "learning_rate": 0.003,
                 "decay_type": None, "label_smoothing": 0.1,
                 "beam_width": 1, "maximum_decoding_length": 30},
      "train": {"batch_size": 64, "batch_type": "examples",
                "max_step": STEPS, "save_checkpoints_steps": EVERY,
                "keep_checkpoint_max": AVERAGE,
                "average_last_checkpoints": AVERAGE,
                "save_summary_steps": EVERY, "sample_buffer_size": -1},
      "infer": {"batch_size": 8},
      "score": {"batch_size": 8, "with_token_level": True}}


def _token_log_probs(path):
  """`onmt-main score` lines with_token_level: NLL ||| TARGET PIECES |||
  each piece's NLL. The sentence's NLL includes </s>, the pieces' do not:
  </s>'s is the difference."""
  scores = []
  with open(path) as f:
    for line in f:
      nll, pieces, token_nll = [field.strip() for field in line.split("|||")]
      pieces_log_probs = [-float(x) for x in token_nll.split()]
      scores.append({
          "target_pieces": pieces.split(), "log_prob": -float(nll),
          "token_log_probs": pieces_log_probs + [
              round(-float(nll) - sum(pieces_log_probs), 6)]})
  return scores


def _keep_the_last(model_dir):
  """Only the last checkpoint stays beside the average: small test data."""
  last = tf.train.latest_checkpoint(model_dir)
  for name in os.listdir(model_dir):
    path = os.path.join(model_dir, name)
    if name.startswith("ckpt-") and not path.startswith(last + "."):
      os.remove(path)
    elif name.startswith(("events.", "projector", "model_examples")):
      os.remove(path)
  _relative_state(model_dir)
  _relative_state(os.path.join(model_dir, "avg"))


def _relative_state(directory):
  """The `checkpoint` file naming its checkpoint relative to `directory`
  (OpenNMT-tf writes absolute paths, which a clone elsewhere cannot
  follow)."""
  name = os.path.basename(tf.train.latest_checkpoint(directory))
  with open(os.path.join(directory, "checkpoint"), "w") as f:
    f.write(f'model_checkpoint_path: "{name}"\n'
            f'all_model_checkpoint_paths: "{name}"\n')


def _make(name):
  model_dir = os.path.join(HERE, name)
  shutil.rmtree(model_dir, ignore_errors=True)
  tf.random.set_seed(1)
  runner = opennmt.Runner(_model(name), _config(model_dir),
                          auto_config=False, seed=1)
  runner.train()
  averaged = os.path.join(model_dir, "avg")
  scores, translations = (os.path.join(model_dir, n)
                          for n in ("scores.txt", "greedy.txt"))
  runner.score(os.path.join(CORPUS, "test.src.pieces"),
               os.path.join(CORPUS, "test.tgt.pieces"),
               checkpoint_path=averaged, output_file=scores)
  runner.infer(os.path.join(CORPUS, "test.src.pieces"), translations,
               checkpoint_path=averaged)
  with open(translations) as f:
    greedy = [line.rstrip("\n") for line in f]
  reference = {
      "environment": {**VERSIONS, "python": sys.version.split()[0]},
      "model": {**SIZES, **OPTIONS[name], "pre_norm": True,
                "layer_norm_epsilon": 1e-3, "position_encoder":
                "SinusoidalPositionEncoder", "output_layer_bias": True},
      "averaged_checkpoints": AVERAGE, "steps": STEPS,
      "scores": _token_log_probs(scores), "greedy": greedy}
  os.remove(scores)
  os.remove(translations)
  _keep_the_last(model_dir)
  with open(os.path.join(model_dir, "reference.json"), "w") as f:
    json.dump(reference, f, indent=1)


def main():
  _write_corpus()
  for name in OPTIONS:
    _make(name)
  for side in ("src", "tgt"):  # made again by this script; not test data
    for suffix in ("", ".pieces"):
      os.remove(os.path.join(CORPUS, f"train.{side}{suffix}"))


if __name__ == "__main__":
  main()
