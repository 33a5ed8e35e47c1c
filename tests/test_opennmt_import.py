"""An OpenNMT-tf Transformer imported (interop/opennmt_tf.py) from its
checkpoint with TensorFlow alone is the same model: per-token
log-probabilities within 1e-4 of OpenNMT-tf's own scoring and its greedy
outputs, on the reference OpenNMT-tf 2.32.0 made (tests/data/opennmt/, a
pre-norm model with shared embeddings and ReLU, and one with three matrices
and GELU in its tanh form). Then it is a run like any other: the command
writes it, it exports to a SavedModel and to CTranslate2, fine-tunes,
averages and scores; what it cannot hold is refused in one line."""

import json
import os

import numpy as np
import pytest
import tensorflow as tf

from conftest import run_script
import rounding
import search_reference
from tf_transformer.data import sequences
from tf_transformer.decoding import scoring
from tf_transformer.run import import_run
from tf_transformer.run import loading
from tf_transformer.interop import opennmt_tf
from tf_transformer.training import evaluator
from training_helpers import UNCOMPILED_FLAGS

DATA = os.path.join(os.path.dirname(os.path.abspath(__file__)), "data",
                    "opennmt")
CORPUS = os.path.join(DATA, "corpus")
VOCABULARY = os.path.join(CORPUS, "onmt.vocab")
SENTENCEPIECE = os.path.join(CORPUS, "sp.model")
ACTIVATION = {"shared": "relu", "three": "gelu_tanh"}
pytestmark = pytest.mark.numeric
# make_reference.py's `maximum_decoding_length`: OpenNMT-tf stops a greedy
# output there without </s>.
ONMT_MAX_LENGTH = 30


def _lines(name):
  with open(os.path.join(CORPUS, name), encoding="utf-8") as f:
    return f.read().splitlines()


def _reference(name):
  with open(os.path.join(DATA, name, "reference.json"),
            encoding="utf-8") as f:
    return json.load(f)


def _import(name, model_dir, path=None):
  kind = opennmt_tf.model_type("custom", 4, ACTIVATION[name])
  return import_run.import_opennmt(
      path or os.path.join(DATA, name), str(model_dir), kind,
      (VOCABULARY,) * 2, (SENTENCEPIECE,) * 2)


def _text(pieces):
  return "".join(pieces.split()).replace("\u2581", " ").strip()


def _bounds(model, vocabulary, sources, targets):
  """`rounding.token_bounds` of the pairs (texts) as the imported model
  reads them: sources without EOS (OpenNMT-tf's), targets with it."""
  processor = vocabulary.make_tokenizer()
  ids = lambda texts, eos: [list(processor.tokenize(t).numpy()) + (
      [3] if eos else []) for t in texts]
  return rounding.token_bounds(model, ids(sources, False),
                               ids(targets, True))


def _assert_same_greedy(model, vocabulary, sources, ours, theirs):
  """Our greedy pieces against OpenNMT-tf's (which stop at its length
  limit, ONMT_MAX_LENGTH): two engines, apart only where greedy decoding
  met a decision within both's float32 rounding
  (tests/search_reference.py)."""
  processor = vocabulary.make_tokenizer()
  index = {piece: i for i, piece in enumerate(vocabulary.piece_list)}
  to_ids = lambda pieces: [index[p] for p in pieces]
  cut = [o[:ONMT_MAX_LENGTH] if len(t) == ONMT_MAX_LENGTH else o
         for o, t in zip(ours, theirs)]
  source_ids = [list(processor.tokenize(t).numpy()) for t in sources]
  search_reference.lines_apart(
      model, source_ids, [[to_ids(o)] for o in cut],
      [[to_ids(t)] for t in theirs], beam_size=1,
      max_length_offset=model.config.decoding.max_decode_length_offset)


@pytest.mark.parametrize("name", ["shared", "three"])
def test_log_probs_and_greedy_equal_opennmt(tmp_path, name):
  reference = _reference(name)
  result = _import(name, tmp_path / "run")
  assert result["read"].endswith("(the average of the run, avg/)")
  model, vocabulary, options = loading.trained(str(tmp_path / "run"), None,
                                               method="greedy")
  config = model.config.model
  assert (config.norm_position, config.layer_norm_epsilon,
          config.positional_encoding, config.source_eos,
          config.decoder_start, config.output_bias, config.share_embeddings,
          config.activation) == (
              "pre", 1e-3, "sinusoidal_opennmt", False, "bos", True,
              name == "shared", ACTIVATION[name])
  tokenizer = vocabulary.make_tokenizer()
  sources, targets = _lines("test.src"), _lines("test.tgt")
  scored = scoring.score_texts(model, tokenizer, tf.constant(sources),
                               tf.constant(targets), 256, 256,
                               tokenizer.target)
  # Two float32 engines (ours, OpenNMT-tf's on its host), each within its
  # bound (rounding.py).
  _, bound = _bounds(model, vocabulary, sources, targets)
  for row, theirs in enumerate(reference["scores"]):
    length = int(scored["lengths"][row])
    assert length == len(theirs["target_pieces"]) + 1
    rounding.assert_within(scored["token_log_probs"][row][:length],
                           theirs["token_log_probs"], 2 * bound[row, :length])
  ids = sequences.source_ids(tokenizer, tf.constant(sources),
                             eos=False).to_tensor()
  best = evaluator.best_ids_fn(model, options)(ids).numpy()
  pieces = vocabulary.piece_list
  ours = [[pieces[i] for i in row if i not in (0, 3)] for row in best]
  _assert_same_greedy(model, vocabulary, sources, ours,
                      [t.split() for t in reference["greedy"]])


def _all_ops(path):
  from test_export import _all_ops as ops  # pylint: disable=g-import-not-at-top
  return ops(path)


@pytest.mark.slow
def test_command_imports_a_run_that_exports(tmp_path):
  """bin/import_model.py says the format; the run's SavedModel (every
  signature, stock ops only) and CTranslate2 export translate and score as
  OpenNMT-tf did."""
  from tensorflow.python.framework import op_def_registry  # pylint: disable=g-import-not-at-top
  from tf_transformer.run.runner import Runner  # pylint: disable=g-import-not-at-top
  from tf_transformer.translators.ct2_runtime import CT2Decoder  # pylint: disable=g-import-not-at-top
  run = tmp_path / "run"
  result = run_script(
      "import_model.py", f"--from={DATA}/three", f"--model_dir={run}",
      "--opennmt_model=custom", "--num_heads=4", "--activation=gelu_tanh",
      f"--vocabulary={VOCABULARY}", f"--sentencepiece={SENTENCEPIECE}")
  assert result.returncode == 0, result.stderr[-3000:]
  assert (f"import_model: reading an OpenNMT-tf checkpoint {DATA}/three/avg/"
          "ckpt-600 (the average of the run, avg/)") in result.stderr
  reference = _reference("three")
  sources, targets = _lines("test.src"), _lines("test.tgt")
  runner = Runner(str(run))
  export = runner.export(str(tmp_path / "export"), method="greedy")
  loaded = tf.saved_model.load(export)
  assert set(loaded.signatures) >= {"serving_default", "score", "nbest"}
  translations = [t.decode() for t in loaded.signatures["serving_default"](
      text=tf.constant(sources))["translation"].numpy()]
  model, vocabulary, _ = loading.trained(str(run), None, method="greedy")
  processor = vocabulary.make_tokenizer()
  pieces = lambda text: [p.decode() for p in processor.id_to_string(
      processor.tokenize(text)).numpy()]
  _assert_same_greedy(model, vocabulary, sources,
                      [pieces(t) for t in translations],
                      [t.split() for t in reference["greedy"]])
  scored = loaded.signatures["score"](source=tf.constant(sources),
                                      target=tf.constant(targets))
  expected = [s["log_prob"] for s in reference["scores"]]
  # Two engines, each within its float32 bound (rounding.py).
  _, bound = _bounds(model, vocabulary, sources, targets)
  rounding.assert_within(scored["log_prob"].numpy(), expected,
                         2 * bound[:, -1])
  ops, functions = _all_ops(export)
  defined = {f.signature.name for f in functions}
  assert not {op for op in ops if op not in defined and
              op_def_registry.get(op) is None}
  assert not ops & {"PyFunc", "PyFuncStateless", "EagerPyFunc"}
  # CTranslate2: pre-norm, GELU's tanh form, the OpenNMT-tf sinusoids and
  # no source EOS, scored and translated alike.
  ct2 = CT2Decoder(runner.export(str(tmp_path / "ct2"), format="ctranslate2",
                                 method="greedy"))
  for row, (ours, theirs) in enumerate(zip(
      ct2.token_log_probs(sources, targets), reference["scores"])):
    rounding.assert_within(ours, theirs["token_log_probs"],
                           2 * bound[row, :len(ours)])
  _assert_same_greedy(model, vocabulary, sources,
                      [pieces(n[0].decode()) for n in ct2.nbest(sources)[0]],
                      [pieces(t) for t in translations])
  # Transformers' Marian cannot hold it: refused in one line.
  with pytest.raises(ValueError, match="norm_position='pre'"):
    runner.export(str(tmp_path / "hf"), format="transformers")


@pytest.mark.slow
def test_fine_tunes_averages_and_scores(tmp_path):
  """bin/train.py --init_from=<imported run> trains without source EOS:
  its step-0 dev nll is OpenNMT-tf's own on the same pairs; then
  bin/average_checkpoints.py and bin/score.py take the runs."""
  run, tuned = tmp_path / "run", tmp_path / "tuned"
  _import("shared", run)
  reference = _reference("shared")
  source, target = (os.path.join(CORPUS, f"test.{s}") for s in ("src", "tgt"))
  result = run_script(
      "train.py", f"--model_dir={tuned}", f"--init_from={run}", "--dataset=",
      f"--train_source={source}", f"--train_target={target}",
      f"--dev_source={source}", f"--dev_target={target}",
      "--train_steps=6", "--eval_every_steps=6", "--checkpoint_every_secs=0",
      "--mixed_precision=float32", *UNCOMPILED_FLAGS,
      "--hparams=warmup_steps=3,batch_tokens=256,max_decode_length_offset=4")
  assert result.returncode == 0, result.stderr[-3000:]
  evaluations = json.loads((tuned / "evaluations.json").read_text())
  assert [e["step"] for e in evaluations] == [0, 6]
  token_log_probs = [p for s in reference["scores"]
                     for p in s["token_log_probs"]]
  model, vocabulary, _ = loading.trained(str(run), None)
  sources, targets = _lines("test.src"), _lines("test.tgt")
  _, bound = _bounds(model, vocabulary, sources, targets)
  # The mean of the tokens' negative log-probabilities: each engine's
  # within its bound (rounding.py), their means (and the mean's own
  # roundings, within n u of it) within the bounds' mean.
  tokens = [b for row, s in zip(bound, reference["scores"])
            for b in row[:len(s["token_log_probs"])]]
  mean = -np.mean(token_log_probs)
  assert evaluations[0]["metrics"]["nll"] == pytest.approx(
      mean, abs=2 * np.mean(tokens) + 2 * len(tokens) * rounding.U32 * mean)
  averaged = tmp_path / "averaged"
  result = run_script("average_checkpoints.py", f"--model_dir={tuned}",
                      "--num_checkpoints=2", f"--output_dir={averaged}")
  assert result.returncode == 0, result.stderr[-3000:]
  for model, expected in ((run, [s["log_prob"] for s in reference["scores"]]),
                          (averaged, None)):
    result = run_script("score.py", f"--model={model}", f"--source={source}",
                        f"--target={target}")
    assert result.returncode == 0, result.stderr[-3000:]
    scores = [float(line.split("\t")[0])
              for line in result.stdout.splitlines()]
    assert len(scores) == len(reference["scores"])
    if expected is not None:  # printed to 4 decimals; two engines
      rounding.assert_within(scores, expected, 5e-5 + 2 * bound[:, -1])


def test_the_opennmt_sinusoids():
  """"sinusoidal_opennmt": [sin | cos] of position + 1, frequencies
  10000^(-i / (d/2 - 1)), as OpenNMT-tf's SinusoidalPositionEncoder."""
  from tf_transformer.layers.embedding import sinusoid_table  # pylint: disable=g-import-not-at-top
  d_model, positions = 8, np.arange(5)
  angles = (positions[:, None] + 1) * np.exp(
      np.arange(4) * -np.log(10000.0) / 3)
  # float32 against float64: the frequency (an exponential, FUNCTION
  # roundings), the angle (one more), the sine (FUNCTION more and its
  # rounding).
  rounding.assert_within(
      sinusoid_table(positions, d_model, kind="sinusoidal_opennmt"),
      np.concatenate([np.sin(angles), np.cos(angles)], -1),
      ((rounding.FUNCTION + 2) * np.concatenate([angles, angles], -1)
       + rounding.FUNCTION + 1) * rounding.U32)


def _rewrite(prefix, out, drop=(), add=None, rename=("", "")):
  """A copy of checkpoint `prefix` at `out` without the variables whose
  names contain one of `drop`, with `add` ({name: array}) added and
  `rename`'s first substring replaced by its second in every name."""
  reader = tf.train.load_checkpoint(prefix)
  kept = [n for n in reader.get_variable_to_shape_map()
          if not any(d in n for d in drop)
          and n != "_CHECKPOINTABLE_OBJECT_GRAPH"]
  tensors = [reader.get_tensor(n) for n in kept]
  names = [n.replace(*rename) if rename[0] else n for n in kept]
  for name, value in (add or {}).items():
    names.append(name)
    tensors.append(tf.constant(value))
  os.makedirs(os.path.dirname(out), exist_ok=True)
  tf.raw_ops.SaveV2(prefix=out, tensor_names=names,
                    shape_and_slices=[""] * len(names), tensors=tensors)
  return out


@pytest.mark.parametrize("change,needle", [
    (dict(add={"model/encoder/layers/0/self_attention/layer/"
               "relative_position_keys/.ATTRIBUTES/VARIABLE_VALUE":
               np.zeros([41, 8], np.float32)}), "relative positions"),
    (dict(add={"model/encoder/extra/.ATTRIBUTES/VARIABLE_VALUE":
               np.zeros([2], np.float32)}), "no place for"),
    (dict(drop=("encoder/layers/0/ffn/layer/outer/bias",)),
     "no variable model/encoder/layers/0/ffn/layer/outer/bias"),
])
def test_checkpoint_refusals_name_the_variable(tmp_path, change, needle):
  prefix = _rewrite(os.path.join(DATA, "shared", "avg", "ckpt-600"),
                    str(tmp_path / "ckpt" / "ckpt-1"), **change)
  with pytest.raises(ValueError, match=needle):
    _import("shared", tmp_path / "run", path=prefix)
  assert not (tmp_path / "run").exists()


def test_a_shallower_decoder_imports_at_its_own_depth(tmp_path):
  """A checkpoint whose decoder has fewer layers than its encoder (a
  student's): each stack keeps its depth, and the decoder's layer is the
  checkpoint's."""
  original = os.path.join(DATA, "shared", "avg", "ckpt-600")
  prefix = _rewrite(original, str(tmp_path / "ckpt" / "ckpt-1"),
                    drop=("decoder/layers/1/",))
  _import("shared", tmp_path / "run", path=prefix)
  model, _, _ = loading.trained(str(tmp_path / "run"), None)
  config = model.config.model
  assert (config.num_encoder_layers, config.num_decoder_layers) == (2, 1)
  named = model.named_weights()
  assert (len(named.encoder.layers), len(named.decoder.layers)) == (2, 1)
  reader = tf.train.load_checkpoint(original)
  kernel = ("model/decoder/layers/0/ffn/layer/inner/kernel/"
            ".ATTRIBUTES/VARIABLE_VALUE")
  np.testing.assert_array_equal(
      named.decoder.layers[0].feed_forward.inner.kernel,
      reader.get_tensor(kernel))


def test_a_post_norm_checkpoint_imports_post_norm(tmp_path):
  """OpenNMT-tf's pre_norm=False: each sub-layer's `output_layer_norm`
  after its residual, no final norm on the stacks."""
  prefix = _rewrite(os.path.join(DATA, "shared", "avg", "ckpt-600"),
                    str(tmp_path / "ckpt" / "ckpt-1"),
                    drop=("model/encoder/layer_norm/",
                          "model/decoder/layer_norm/"),
                    rename=("input_layer_norm", "output_layer_norm"))
  _import("shared", tmp_path / "run", path=prefix)
  model, _, _ = loading.trained(str(tmp_path / "run"), None)
  assert model.config.model.norm_position == "post"


def test_vocabulary_refusals_name_the_file_and_line(tmp_path):
  tokens = _lines("onmt.vocab")
  cases = {
      "shuffled": (tokens[1:2] + tokens[:1] + tokens[2:], "lines 1-3"),
      "repeated": (tokens + [tokens[5]], "line 61 repeats"),
      "short": (tokens[:-1], "59 tokens \\+ the OOV row"),
      "unk": (tokens + ["<unk>"], "line 61: '<unk>'"),
  }
  for name, (lines, needle) in cases.items():
    path = tmp_path / name
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    with pytest.raises(ValueError, match=needle):
      import_run.import_opennmt(
          os.path.join(DATA, "shared"), str(tmp_path / "run"),
          opennmt_tf.model_type("custom", 4, "relu"), (str(path),) * 2,
          (SENTENCEPIECE,) * 2)
  swapped = tmp_path / "swapped"
  swapped.write_text("\n".join(tokens[:3] + tokens[4:5] + tokens[3:4]
                               + tokens[5:]) + "\n", encoding="utf-8")
  with pytest.raises(ValueError, match="one joint vocabulary"):
    import_run.import_opennmt(
        os.path.join(DATA, "shared"), str(tmp_path / "run"),
        opennmt_tf.model_type("custom", 4, "relu"),
        (VOCABULARY, str(swapped)), (SENTENCEPIECE,) * 2)
  with pytest.raises(FileNotFoundError, match="no such SentencePiece model"):
    import_run.import_opennmt(
        os.path.join(DATA, "shared"), str(tmp_path / "run"),
        opennmt_tf.model_type("custom", 4, "relu"), (VOCABULARY,) * 2,
        (str(tmp_path / "missing.model"),) * 2)
  assert not (tmp_path / "run").exists()


def test_model_type_refusals_and_flags(tmp_path):
  assert opennmt_tf.model_type("TransformerBig").num_heads == 16
  assert opennmt_tf.model_type("ScalingNmtEnDe").source_eos
  for args, needle in ((("TransformerBaseRelative",), "relative positions"),
                       (("NoSuchModel",), "one of"),
                       (("custom",), "needs --num_heads and --activation"),
                       (("Transformer", 4, "relu"), "fixes them"),
                       (("custom", 4, "gelu"), "--activation=gelu")):
    with pytest.raises(ValueError, match=needle):
      opennmt_tf.model_type(*args)
  run = tmp_path / "run"
  # Refused flags answer in the two lines of any refused flag.
  for args, needle in (
      ((f"--from={DATA}/shared", "--opennmt_model=Transformer"),
       "--vocabulary is needed"),
      ((f"--from={DATA}/shared", "--opennmt_model=Nope",
        f"--vocabulary={VOCABULARY}", f"--sentencepiece={SENTENCEPIECE}"),
       "--opennmt_model=Nope"),
      ((f"--from={CORPUS}", "--opennmt_model=Transformer"),
       "--opennmt_model is for an OpenNMT-tf checkpoint"),
      ((f"--from={DATA}/shared", "--opennmt_model=Transformer",
        f"--vocabulary={VOCABULARY}"),
       "one of --sentencepiece and --tokenization")):
    result = run_script("import_model.py", *args, f"--model_dir={run}")
    assert result.returncode != 0
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 2 and needle in lines[0], result.stderr
  assert not run.exists()


def test_tokenization_configs(tmp_path):
  """--tokenization takes OpenNMT-tf's tokenization YAML: SentencePiece's
  model from it, sampling options let through, any other option of the
  OpenNMT Tokenizer refused by name."""
  cases = {
      "type: SentencePieceTokenizer\nparams:\n  model: sp.model\n"
      "  nbest_size: 64\n  alpha: 0.1\n": "sp.model",
      "mode: none\nsp_model_path: /data/sp.model\n": "/data/sp.model",
      "type: OpenNMTTokenizer\nparams:\n  mode: none\n"
      "  sp_model_path: sp.model\n  sp_nbest_size: 20\n": "sp.model",
  }
  for number, (text, model) in enumerate(cases.items()):
    path = tmp_path / f"ok{number}.yml"
    path.write_text(text)
    assert opennmt_tf.tokenization_model(str(path)) == os.path.join(
        str(tmp_path), model)
  for text, needle in (
      ("mode: aggressive\nsp_model_path: sp.model\n", "mode: aggressive"),
      ("mode: none\nsp_model_path: sp.model\njoiner_annotate: true\n",
       "joiner_annotate: an OpenNMT Tokenizer option"),
      ("type: SpaceTokenizer\n", "type: SpaceTokenizer"),
      ("mode: none\n", "names no SentencePiece model"),
      ("[1, 2]\n", "not a tokenization config")):
    path = tmp_path / "bad.yml"
    path.write_text(text)
    with pytest.raises(ValueError, match=needle):
      opennmt_tf.tokenization_model(str(path))
  config = tmp_path / "tok.yml"
  config.write_text(f"mode: none\nsp_model_path: {SENTENCEPIECE}\n")
  result = run_script(
      "import_model.py", f"--from={DATA}/shared", "--opennmt_model=custom",
      "--num_heads=4", "--activation=relu", f"--vocabulary={VOCABULARY}",
      f"--tokenization={config}", f"--model_dir={tmp_path / 'run'}")
  assert result.returncode == 0, result.stderr[-3000:]
  with open(SENTENCEPIECE, "rb") as f:
    assert (tmp_path / "run" / "marian" / "source.spm").read_bytes() == (
        f.read())


def test_training_batches_without_source_eos(tmp_path):
  """`source_eos=False` leaves the sources' EOS off the training batches."""
  from tf_transformer.data import epoch_batches  # pylint: disable=g-import-not-at-top
  class Store:  # pylint: disable=too-few-public-methods
    num_pairs = 2
    source = np.array([5, 6, 7], np.int32)
    target = np.array([8, 9], np.int32)
    offsets = np.array([[0, 0], [2, 1], [3, 2]])

    def lengths(self):
      return np.array([2, 1]), np.array([1, 1])
  for source_eos, expected in ((True, [[5, 6, 3], [7, 3, 0]]),
                               (False, [[5, 6, 0], [7, 0, 0]])):
    batches = epoch_batches.EpochBatches(Store(), 64, 8,
                                         source_eos=source_eos)
    source, _, _ = batches.batch(0, 0)
    rows = sorted(r[:3].tolist() for r in source)
    assert rows == sorted(expected)
