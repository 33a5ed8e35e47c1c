"""A Marian release (model .npz with `special:model.yml`, *.vocab.yml,
source.spm, target.spm) imported (interop/marian_npz.py) scores as
CTranslate2's own `MarianConverter` conversion of the same files does, for
tied, target-tied and untied embeddings, relu and swish, post- and
pre-norm; what it cannot represent is refused in one line, and a refused
import writes nothing."""

import os

import ctranslate2
import keras
import numpy as np
import pytest
import sentencepiece as spm
import tensorflow as tf

from conftest import run_script
from tf_transformer import special_ids
from tf_transformer.run.import_run import import_marian
from tf_transformer.interop import marian_npz

import rounding
import search_reference
from test_marian_import import SENTENCES, _spm  # pylint: disable=g-bad-import-order
from training_helpers import UNCOMPILED_FLAGS

pytestmark = pytest.mark.numeric


def _ids(vocabulary, side, texts):
  """Our ids of `texts` as a Marian vocabulary reads `side`, EOS last."""
  return [row + [special_ids.EOS_ID]
          for row in vocabulary.processor(side).encode(texts)]

D_MODEL, D_FF, HEADS, LAYERS = 16, 32, 4, 2
# Pieces YAML would read as a boolean, a number or null, unless read as
# strings only.
TRICKY = ["no", "yes", "1", "null", "~", "true", "0.5"]


def _model_yml(activation, tied, pre_norm, vocab_size, depths=(LAYERS, LAYERS),
               **overrides):
  yml = {
      "type": "transformer", "dim-emb": D_MODEL, "enc-depth": depths[0],
      "dec-depth": depths[1], "transformer-heads": HEADS,
      "transformer-dim-ffn": D_FF, "transformer-ffn-depth": 2,
      "transformer-ffn-activation": activation,
      "transformer-preprocess": "n" if pre_norm else "",
      "transformer-postprocess": "da" if pre_norm else "dan",
      "transformer-postprocess-top": "n" if pre_norm else "",
      "transformer-postprocess-emb": "d",
      "transformer-decoder-autoreg": "self-attention",
      "transformer-no-projection": "false",
      "transformer-guided-alignment-layer": "last",
      "guided-alignment": "none", "tied-embeddings-all": str(tied == "all"),
      "tied-embeddings": str(tied == "decoder"),
      "dim-vocabs": [vocab_size, vocab_size], "max-length": 100,
      "transformer-dropout": 0.1}
  yml.update(overrides)
  lines = []
  for key, value in yml.items():
    if isinstance(value, list):
      lines += [f"{key}:"] + [f"  - {v}" for v in value]
    else:
      value = '""' if value == "" else str(value).lower()
      lines.append(f"{key}: {value}")
  return "\n".join(lines) + "\n"


def _save_release(directory, activation="swish", tied="all", pre_norm=False,
                  depths=(LAYERS, LAYERS), **overrides):
  """A tiny random Marian release as OPUS-MT ships one: the model .npz
  (Marian's tensor names; `special:model.yml` a NUL-ended char array),
  one joint vocabulary (</s> 0, <unk> 1, no <pad>), source.spm and
  target.spm; `depths`, the encoder's and the decoder's layers. Returns
  the pieces by id."""
  protos = {"source.spm": _spm(SENTENCES),
            "target.spm": _spm([s.upper() for s in SENTENCES])}
  pieces = set(TRICKY) | {">>fra<<"}
  for name, proto in protos.items():
    with open(os.path.join(directory, name), "wb") as f:
      f.write(proto)
    processor = spm.SentencePieceProcessor(model_proto=proto)
    pieces |= {processor.id_to_piece(i)
               for i in range(processor.get_piece_size())
               if not (processor.is_control(i) or processor.is_unknown(i))}
  pieces = ["</s>", "<unk>"] + sorted(pieces)
  with open(os.path.join(directory, "opus.spm32k-spm32k.vocab.yml"), "w",
            encoding="utf-8") as f:
    for i, piece in enumerate(pieces):
      # Quoted where YAML would read the piece as syntax, as Marian's
      # emitter (yaml-cpp) writes them; plain otherwise, "no" and "1" too.
      quoted = f'"{piece}"' if piece[0] in "<>!&*|%@`'\"{[,#?:-" else piece
      f.write(f"{quoted}: {i}\n")
  rng = np.random.default_rng(0)
  v = len(pieces)

  def rand(*shape, scale=0.5):
    return (rng.standard_normal(shape) * scale).astype(np.float32)

  tensors = {"decoder_ff_logit_out_b": rand(1, v)}
  if tied == "all":
    tensors["Wemb"] = rand(v, D_MODEL)
  else:
    tensors["encoder_Wemb"] = rand(v, D_MODEL)
    tensors["decoder_Wemb"] = rand(v, D_MODEL)
  if tied == "none":
    tensors["decoder_ff_logit_out_W"] = rand(D_MODEL, v)
  suffix = "_pre" if pre_norm else ""
  for stack, depth in zip(("encoder", "decoder"), depths):
    for i in range(1, depth + 1):
      blocks = ["self"] + (["context"] if stack == "decoder" else [])
      for block in blocks:
        scope = f"{stack}_l{i}_{block}"
        for w in "qkvo":
          tensors[f"{scope}_W{w}"] = rand(D_MODEL, D_MODEL)
          tensors[f"{scope}_b{w}"] = rand(1, D_MODEL, scale=0.1)
        tensors[f"{scope}_Wo_ln_scale{suffix}"] = 1 + rand(1, D_MODEL,
                                                           scale=0.1)
        tensors[f"{scope}_Wo_ln_bias{suffix}"] = rand(1, D_MODEL, scale=0.1)
      scope = f"{stack}_l{i}_ffn"
      tensors[f"{scope}_W1"] = rand(D_MODEL, D_FF)
      tensors[f"{scope}_b1"] = rand(1, D_FF, scale=0.1)
      tensors[f"{scope}_W2"] = rand(D_FF, D_MODEL)
      tensors[f"{scope}_b2"] = rand(1, D_MODEL, scale=0.1)
      tensors[f"{scope}_ffn_ln_scale{suffix}"] = 1 + rand(1, D_MODEL,
                                                          scale=0.1)
      tensors[f"{scope}_ffn_ln_bias{suffix}"] = rand(1, D_MODEL, scale=0.1)
    if pre_norm:
      tensors[f"{stack}_top_ln_scale"] = 1 + rand(1, D_MODEL, scale=0.1)
      tensors[f"{stack}_top_ln_bias"] = rand(1, D_MODEL, scale=0.1)
  yml = _model_yml(activation, tied, pre_norm, v, depths, **overrides)
  tensors[marian_npz.MODEL_YML] = np.frombuffer(
      yml.encode() + b"\0", np.int8)
  np.savez(os.path.join(directory, "opus.spm32k-spm32k.transformer.model1"
                        ".npz.best-perplexity.npz"), **tensors)
  return pieces


def _ct2(directory, output_dir):
  converter = ctranslate2.converters.MarianConverter(
      marian_npz.find_files(directory)[0],
      [marian_npz.find_files(directory)[1]])
  converter.convert(output_dir, force=True)
  return ctranslate2.Translator(output_dir, device="cpu")


def _token_pairs(pieces, count, seed=0):
  rng = np.random.default_rng(seed)
  ordinary = pieces[2:]
  for _ in range(count):
    yield ([ordinary[i] for i in rng.integers(0, len(ordinary),
                                              rng.integers(1, 12))],
           [ordinary[i] for i in rng.integers(0, len(ordinary),
                                              rng.integers(1, 12))])


@pytest.mark.parametrize("activation,tied,pre_norm,depths", [
    ("swish", "all", False, (2, 2)), ("relu", "decoder", False, (2, 2)),
    ("swish", "none", True, (2, 2)),
    ("swish", "all", False, (3, 1))])  # a student's deep-shallow depths
def test_scores_equal_ctranslate2(tmp_path, monkeypatch, activation, tied,
                                  pre_norm, depths):
  if pre_norm:
    # CTranslate2's layer norms add 1e-5 to the variance, Marian's 1e-6:
    # compared at CTranslate2's, the rest of the mapping is what is tested
    # (at Marian's, this model's pre-norm scores differ by ~1.5e-4).
    monkeypatch.setattr(marian_npz, "LAYER_NORM_EPSILON", 1e-5)
  release = tmp_path / "release"
  release.mkdir()
  pieces = _save_release(str(release), activation, tied, pre_norm, depths)
  translator = _ct2(str(release), str(tmp_path / "ct2"))
  imported, _ = marian_npz.from_marian(str(release))
  named = imported.model.named_weights()
  assert (len(named.encoder.layers), len(named.decoder.layers)) == depths
  ours_id = {pieces[marian_id]: i for i, marian_id in
             enumerate(imported.order) if marian_id < len(pieces)}
  pairs = list(_token_pairs(pieces, 30))
  theirs = translator.score_batch([s for s, _ in pairs], [t for _, t in pairs])
  # Ours: the 30 pairs as one padded batch (one eager call, not 30).
  sources = [[ours_id[p] for p in s] + [special_ids.EOS_ID] for s, _ in pairs]
  labels = [[ours_id[p] for p in t] + [special_ids.EOS_ID] for _, t in pairs]
  padded = lambda rows: keras.utils.pad_sequences(
      rows, padding="post", value=special_ids.PAD_ID)
  log_probs = tf.nn.log_softmax(imported.model((
      padded(sources), padded([[special_ids.BOS_ID] + row[:-1]
                               for row in labels])))).numpy()
  # Two float32 engines (CTranslate2 fuses Q, K and V and sums in its own
  # order), each within its bound (rounding.py).
  _, bound = rounding.token_bounds(imported.model, sources, labels)
  for row, (label, result) in enumerate(zip(labels, theirs)):
    ours = log_probs[row, np.arange(len(label)), label]
    assert len(result.log_probs) == len(ours)
    rounding.assert_within(ours, result.log_probs,
                           2 * bound[row, :len(label)])
    # <pad> (appended: Marian has none) takes no probability to speak of.
    assert np.exp(log_probs[row, :len(label), special_ids.PAD_ID]).max() < (
        1e-40)
  assert imported.model.config.model.share_embeddings == (tied == "all")


def test_vocabulary_pieces_stay_strings(tmp_path):
  _save_release(str(tmp_path))
  pieces = marian_npz.read_vocabulary(
      marian_npz.find_files(str(tmp_path))[1])
  assert set(TRICKY) <= set(pieces)
  assert pieces[:2] == ["</s>", "<unk>"]


@pytest.mark.slow
def test_imported_release_serves_and_scores_as_ctranslate2(tmp_path):
  """bin/import_model.py on a Marian release writes a run whose SavedModel
  translates text and scores it as CTranslate2's conversion of the release
  does on the same pieces, and whose own CTranslate2 export translates as
  the SavedModel."""
  from tf_transformer.run.runner import Runner  # pylint: disable=g-import-not-at-top
  release = tmp_path / "release"
  release.mkdir()
  _save_release(str(release), tied="decoder")
  run = tmp_path / "run"
  result = run_script("import_model.py", f"--from={release}",
                      f"--model_dir={run}")
  assert result.returncode == 0, result.stderr
  assert "tied-embeddings" in result.stderr  # the note on tied matrices
  export = Runner(str(run)).export(str(tmp_path / "export"),
                                   method="greedy",
                                   max_decode_length_offset=8)
  loaded = tf.saved_model.load(export)
  texts, targets = SENTENCES[:3], ["THE CAT SAT", "A DOG", "TWO CATS"]
  translations = loaded.signatures["serving_default"](
      text=tf.constant(texts))["translation"].numpy()
  assert len(translations) == 3
  scored = loaded.signatures["score"](source=tf.constant(texts),
                                      target=tf.constant(targets))
  source_spm = spm.SentencePieceProcessor(
      model_file=str(release / "source.spm"))
  target_spm = spm.SentencePieceProcessor(
      model_file=str(release / "target.spm"))
  theirs = _ct2(str(release), str(tmp_path / "ct2")).score_batch(
      [source_spm.encode(t, out_type=str) for t in texts],
      [target_spm.encode(t, out_type=str) for t in targets])
  # Two engines, each within its float32 bound (rounding.py).
  from tf_transformer.run import loading  # pylint: disable=g-import-not-at-top
  model, vocabulary, _ = loading.trained(str(run), None, method="greedy")
  _, bound = rounding.token_bounds(model, _ids(vocabulary, "source", texts),
                                   _ids(vocabulary, "target", targets))
  rounding.assert_within(scored["log_prob"].numpy(),
                         [sum(r.log_probs) for r in theirs], 2 * bound[:, -1])
  # The other signatures: n-best lists, prefixes cut by target.spm, and
  # the attention behind a translation, over the pieces the model read.
  signatures = loaded.signatures
  nbest = signatures["nbest"](text=tf.constant(texts))["translations"]
  assert nbest.shape[0] == 3
  assert list(nbest[:, 0].numpy()) == list(translations)
  prefixed = signatures["translate_with_prefix"](
      text=tf.constant(texts), prefix=tf.constant(["THE CAT", "", "TWO"]))
  got = [t.decode() for t in prefixed["translation"].numpy()]
  assert got[0].startswith("THE CAT") and got[2].startswith("TWO")
  shown = signatures["attention"](text=tf.constant([">>fra<< the cat"]))
  tokens = [t.decode() for t in shown["source_tokens"].numpy()[0]]
  assert tokens[0] == ">>fra<<"
  assert "".join(tokens[1:]).startswith("\u2581the\u2581cat")
  assert shown["encoder_decoder"].shape[:3] == (1, LAYERS, HEADS)
  # The run's own CTranslate2 export: the SavedModel's translations and
  # CTranslate2's scores of the same texts, a target-language token too.
  from tf_transformer.translators.ct2_runtime import CT2Decoder  # pylint: disable=g-import-not-at-top
  ct2 = CT2Decoder(Runner(str(run)).export(
      str(tmp_path / "run_ct2"), format="ctranslate2", method="greedy",
      max_decode_length_offset=8))
  texts = texts + [">>fra<< the cat"]
  translations = loaded.signatures["serving_default"](
      text=tf.constant(texts))["translation"].numpy()
  # One text a call: CTranslate2's output limit is its batch's longest
  # (ct2_runtime.py), and a random model's outputs run to the limit. Two
  # engines: the same outputs but where greedy decoding met a decision
  # within their float32 rounding (tests/search_reference.py).
  theirs_texts = [ct2.nbest([t])[0][0][0] for t in texts]
  target_ids = lambda texts: [[row[:-1]] for row in _ids(
      vocabulary, "target", [t.decode() if isinstance(t, bytes) else t
                             for t in texts])]
  search_reference.lines_apart(
      model, [row[:-1] if not model.config.model.source_eos else row
              for row in _ids(vocabulary, "source", texts)],
      target_ids(theirs_texts), target_ids(translations), beam_size=1,
      max_length_offset=8)
  assert ct2.pieces(texts[-1:])[0][0] == ">>fra<<"
  ours = ct2.token_log_probs(texts[:3], targets)
  rounding.assert_within([sum(t) for t in ours],
                         [sum(r.log_probs) for r in theirs], 2 * bound[:, -1])


@pytest.mark.parametrize("change,needle", [
    (dict(**{"transformer-ffn-activation": "gelu"}),
     "transformer-ffn-activation: 'gelu'"),
    (dict(**{"transformer-decoder-autoreg": "average-attention"}),
     "transformer-decoder-autoreg: 'average-attention'"),
    (dict(**{"transformer-postprocess-emb": "dn"}),
     "transformer-postprocess-emb"),
    (dict(**{"factors-dim-emb": 8}), "factored vocabularies"),
    (dict(type="s2s"), "type: 's2s'"),
])
def test_refusals_name_the_option(tmp_path, change, needle):
  release = tmp_path / "release"
  release.mkdir()
  _save_release(str(release), **change)
  run = tmp_path / "run"
  with pytest.raises(ValueError) as error:
    import_marian(str(release), str(run))
  assert needle in str(error.value)
  assert len(str(error.value).splitlines()) == 1
  assert not run.exists() and not (tmp_path / "run.importing").exists()


def test_bad_files_are_refused(tmp_path):
  _save_release(str(tmp_path))
  model, vocab = marian_npz.find_files(str(tmp_path))
  with open(vocab, encoding="utf-8") as f:
    lines = f.readlines()
  with open(vocab, "w", encoding="utf-8") as f:
    f.writelines(lines[:-1])
  with pytest.raises(ValueError, match="pieces, but model.yml's dim-vocabs"):
    marian_npz.from_marian(str(tmp_path))
  os.unlink(vocab)
  with pytest.raises(ValueError, match=r"0 \*\.vocab\.yml files"):
    marian_npz.from_marian(str(tmp_path))
  with open(model, "rb") as f:
    data = f.read()
  with open(model, "wb") as f:
    f.write(data[:len(data) // 2])
  with pytest.raises(ValueError, match="unreadable .npz"):
    marian_npz.read_model(model)


@pytest.mark.slow
def test_fine_tunes_an_imported_release(tmp_path):
  """bin/train.py --init_from=<imported run> trains on the user's files with
  the imported vocabulary and options: step 0 is the imported model,
  evaluated (its dev nll is the one computed here from the import), and the
  dev nll falls."""
  import json  # pylint: disable=g-import-not-at-top
  from tf_transformer.data.marian_vocabulary import MarianVocabulary  # pylint: disable=g-import-not-at-top
  from tf_transformer.training.evaluator import teacher_forced_losses  # pylint: disable=g-import-not-at-top
  release = tmp_path / "release"
  release.mkdir()
  _save_release(str(release))
  run, tuned = tmp_path / "run", tmp_path / "tuned"
  import_marian(str(release), str(run))
  files = {}
  for split, lines in (("train", SENTENCES), ("dev", SENTENCES[:8])):
    for language, text in (("en", lines), ("de", [s.upper() for s in lines])):
      files[f"{split}.{language}"] = path = tmp_path / f"{split}.{language}"
      path.write_text("\n".join(text) + "\n")
  result = run_script(
      "train.py", f"--model_dir={tuned}",
      f"--init_from={run}", "--dataset=",
      f"--train_source={files['train.en']}",
      f"--train_target={files['train.de']}",
      f"--dev_source={files['dev.en']}", f"--dev_target={files['dev.de']}",
      "--train_steps=20", "--eval_every_steps=20",
      "--checkpoint_every_secs=0",
      # float32 given: the default (auto) may choose bfloat16 on a CPU with
      # AVX512_BF16, and step 0's nll is then the import's to within
      # bfloat16's rounding (about 1e-3), not float32's.
      "--mixed_precision=float32", *UNCOMPILED_FLAGS,
      "--hparams=warmup_steps=10,max_decode_length_offset=4")
  assert result.returncode == 0, result.stderr[-3000:]
  assert "initialized the model weights from" in result.stderr
  assert (tuned / "marian" / "vocab.json").read_bytes() == (
      run / "marian" / "vocab.json").read_bytes()
  evaluations = json.loads((tuned / "evaluations.json").read_text())
  assert [e["step"] for e in evaluations] == [0, 20]
  imported, _ = marian_npz.from_marian(str(release))
  dev = list(zip(SENTENCES[:8], [s.upper() for s in SENTENCES[:8]]))
  vocabulary = MarianVocabulary.load(str(run))
  expected = teacher_forced_losses(imported.model, vocabulary, dev)
  # The mean token nll of two passes (the trainer's batches, this one),
  # each token's within its float32 bound (rounding.py), the means within
  # the bounds' mean and the mean's own roundings (n u of it).
  _, bound = rounding.token_bounds(
      imported.model, _ids(vocabulary, "source", [s for s, _ in dev]),
      _ids(vocabulary, "target", [t for _, t in dev]))
  tokens = np.concatenate([row[:len(t) + 1] for row, t in zip(
      bound, vocabulary.processor("target").encode([t for _, t in dev]))])
  assert evaluations[0]["metrics"]["nll"] == pytest.approx(
      expected["nll"], abs=2 * tokens.mean() + 2 * len(tokens)
      * rounding.U32 * expected["nll"])
  assert evaluations[1]["metrics"]["nll"] < evaluations[0]["metrics"]["nll"]
  # The imported run and its tuned one: one vocabulary, so an ensemble
  # (bin/translate.py --model_dir twice), in Transformers' text form.
  translated = run_script(
      "translate.py", f"--model_dir={run}", f"--model_dir={tuned}",
      "--decoding=greedy", "--max_length_offset=4",
      input_text=">>fra<< the cat sat\na dog ran\n")
  assert translated.returncode == 0, translated.stderr[-3000:]
  assert len(translated.stdout.splitlines()) == 2
