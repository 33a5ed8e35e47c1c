"""A Transformers `MarianMTModel` imported (interop/marian.py) is the
same model: teacher-forced log-probabilities, greedy and beam outputs equal
Transformers' own on a tiny random model saved with `save_pretrained`, for
each activation, shared and separate embeddings; what it cannot represent
is refused in one line. Needs torch and transformers (the [test] extra)."""

import json
import os

import keras
import numpy as np
import pytest
import tensorflow as tf

import torch
import transformers

from conftest import run_script
import rounding
import search_reference
from tf_transformer import special_ids
from tf_transformer.decoding import search
from tf_transformer.interop import marian

VOCAB = 60
PAD, EOS, UNK = VOCAB - 1, 0, 1  # Marian's layout: </s> 0, <unk> 1, <pad> last


def _save(directory, activation="swish", share=True, vocab_size=VOCAB,
          **overrides):
  """A tiny random MarianMTModel with OPUS-MT's settings (<pad> last), its
  weights spread so that its outputs are far from uniform, saved as
  `save_pretrained` does, with a vocab.json."""
  torch.manual_seed(0)
  pad = vocab_size - 1
  config = transformers.MarianConfig(**dict(dict(
      vocab_size=vocab_size, decoder_vocab_size=vocab_size, d_model=16,
      encoder_layers=2, decoder_layers=2, encoder_attention_heads=4,
      decoder_attention_heads=4, encoder_ffn_dim=32, decoder_ffn_dim=32,
      max_position_embeddings=64, pad_token_id=pad, eos_token_id=EOS,
      decoder_start_token_id=pad, activation_function=activation,
      scale_embedding=True, share_encoder_decoder_embeddings=share),
      **overrides))
  model = transformers.MarianMTModel(config).eval()
  with torch.no_grad():
    model.final_logits_bias.normal_()
    for p in model.parameters():
      if p.requires_grad:  # (the sinusoids are frozen parameters)
        p.add_(torch.randn_like(p) * 0.3)
    model.model.decoder.embed_tokens.weight[pad] = 0  # as OPUS-MT's
    model.model.encoder.embed_tokens.weight[pad] = 0
  model.save_pretrained(directory)
  vocab = {"</s>": EOS, "<unk>": UNK, "<pad>": pad,
           **{f"p{i}": i for i in range(2, pad)}}
  with open(os.path.join(directory, "vocab.json"), "w") as f:
    json.dump(vocab, f)
  return model


def _pairs(count, seed=0):
  rng = np.random.default_rng(seed)
  for _ in range(count):
    source = np.append(rng.integers(2, PAD, rng.integers(2, 12)), EOS)
    target = np.append(rng.integers(1, PAD, rng.integers(1, 12)), EOS)
    yield source, target


def _log_softmax(logits):
  return tf.nn.log_softmax(logits).numpy()


# One case in the quick tier; the other activations and the unshared
# embeddings (the same import, other options) in the slow tier.
@pytest.mark.parametrize("activation,share", [
    pytest.param("swish", True, marks=pytest.mark.slow), ("relu", True),
    pytest.param("gelu", True, marks=pytest.mark.slow),
    pytest.param("swish", False, marks=pytest.mark.slow)])
def test_log_probs_equal_transformers(tmp_path, activation, share):
  """Over 50 pairs of lengths 2-12 in one padded batch (a source's padding
  masked by each engine's own rule, a target's after its end), each real
  position's log-probabilities are the same."""
  theirs_model = _save(str(tmp_path), activation, share)
  imported = marian.from_transformers(str(tmp_path))
  sources, targets = zip(*_pairs(50))
  _, theirs, ours = _teacher_forced(theirs_model, imported, sources,
                                    targets, PAD)
  assert np.isfinite(theirs).all() and np.isfinite(ours).all()
  assert bool(imported.notes) == (not share)


def _teacher_forced(theirs_model, imported, sources, targets, pad):
  """Both models teacher forced on the published ids `sources` and
  `targets` (padded with `pad`; ours in its own ids): (their logits,
  their log-probabilities, ours, the largest difference of the two at a
  real target position, over the published ids)."""
  ours_id = np.argsort(imported.order)  # published id -> ours
  padded = lambda rows, value: keras.utils.pad_sequences(
      rows, padding="post", value=value, dtype="int64")
  with torch.no_grad():
    source_ids = torch.tensor(padded(sources, pad))
    logits = theirs_model(input_ids=source_ids,
                          attention_mask=source_ids != pad,
                          labels=torch.tensor(padded(targets, pad))).logits
  theirs = torch.log_softmax(logits, -1).numpy()
  ours = _log_softmax(imported.model((
      padded([ours_id[s] for s in sources], special_ids.PAD_ID),
      padded([np.concatenate([[special_ids.BOS_ID], ours_id[t[:-1]]])
              for t in targets], special_ids.PAD_ID))))
  _assert_within_rounding(imported.model, [ours_id[s] for s in sources],
                          [ours_id[t] for t in targets], ours, theirs,
                          ours_id)
  return logits.numpy(), theirs, ours


def _assert_within_rounding(model, sources, targets, ours, theirs, order):
  """Our log-probabilities `ours` [rows, T, vocab] of each real target
  position (our ids `sources`, `targets`) and Transformers' `theirs` (in
  the published order: ours[..., order]): two engines, each within its
  float32 bound (rounding.py) of the exact values."""
  cells = [(row, t) for row, target in enumerate(targets)
           for t in range(len(target))]
  _, bound = rounding.vocabulary_log_prob_bounds(
      model, [list(sources[row]) for row, _ in cells],
      [list(targets[row][:t]) for row, t in cells])
  rounding.assert_within(np.stack([ours[r, t][order] for r, t in cells]),
                         np.stack([theirs[r, t] for r, t in cells]),
                         2 * bound[:, order])


def _generate(model, source, **kwargs):
  with torch.no_grad():
    out = model.generate(torch.tensor(source[None]), do_sample=False,
                         bad_words_ids=[[PAD]], forced_eos_token_id=None,
                         max_new_tokens=len(source) + 10, **kwargs)
  ids = out[0, 1:].numpy()  # after the decoder start
  return list(ids[ids != PAD])


def _ours(imported, sources, **options):
  """Our search's outputs for `sources` (published ids), decoded as one
  padded batch, in published ids."""
  ours_id = np.argsort(imported.order)
  batch = np.zeros([len(sources), max(map(len, sources))], np.int32)
  for row, source in zip(batch, sources):
    row[:len(source)] = ours_id[source]
  ids, _ = search.decode(imported.model, tf.constant(batch),
                         search.DecodingOptions(max_decode_length_offset=10,
                                                **options))
  return [list(imported.order[row[row != special_ids.PAD_ID]])
          for row in ids.numpy()[:, 0]]


@pytest.mark.slow
def test_greedy_and_beam_equal_transformers(tmp_path):
  theirs_model = _save(str(tmp_path))
  imported = marian.from_transformers(str(tmp_path))
  sources = [source for source, _ in _pairs(40, seed=1)]
  """Two engines of one model: each returns what a reference search by its
  own rules returns (tests/search_reference.py: ours, or Transformers'
  beam search with early_stopping=True), but where that search met a
  decision within float32 rounding; where the two differ, their rules do
  too, or such a decision was met."""
  greedy = _ours(imported, sources, method="greedy")
  beam = _ours(imported, sources, beam_size=4, length_penalty_alpha=0.0)
  ours_id = np.argsort(imported.order)
  model = imported.model
  ids = [list(ours_id[s]) for s in sources]
  our_ids = lambda outputs: [[int(ours_id[t]) for t in o if t != EOS]
                             for o in outputs]
  for beam_size, mine, kwargs in ((1, greedy, dict(num_beams=1)),
                                  (4, beam, dict(num_beams=4,
                                                 length_penalty=0.0,
                                                 early_stopping=True))):
    theirs = [_generate(theirs_model, s, **kwargs) for s in sources]
    references = {rules: search_reference.search(
        model, ids, rules, beam_size, 0.0, 10)
                  for rules in ("ours", "transformers")}
    tie = lambda line, rules: search_reference.near_tie(
        model, ids[line], references[rules][line])
    for line, (a, b) in enumerate(zip(our_ids(mine), our_ids(theirs))):
      for got, rules in ((a, "ours"), (b, "transformers")):
        assert tuple(got) == references[rules][line].tokens or tie(
            line, rules), (beam_size, line, rules)
      if a != b:
        assert (references["ours"][line].tokens
                != references["transformers"][line].tokens
                or tie(line, "ours") or tie(line, "transformers")), line


def test_output_piece_at_bos_id_is_generated(tmp_path):
  """With a zero-vector start, BOS_ID holds an ordinary piece that a search
  may output (Marian's first piece after its specials)."""
  _save(str(tmp_path))
  imported = marian.from_transformers(str(tmp_path))
  assert imported.order[special_ids.BOS_ID] == 2
  assert special_ids.never_output(
      imported.model.config.model.decoder_start) == (special_ids.PAD_ID,)
  named = imported.model.named_weights()
  bias = named.output_bias.numpy()
  bias[:] = -10.0
  bias[special_ids.BOS_ID] = 10.0  # the piece at BOS_ID most likely
  named.output_bias.assign(bias)
  ids, _ = search.decode(imported.model, tf.constant([[5, 6, special_ids.EOS_ID]]),
                         search.DecodingOptions(method="greedy",
                                                max_decode_length_offset=2))
  assert special_ids.BOS_ID in ids.numpy()[0, 0].tolist()


@pytest.mark.parametrize("change,needle", [
    (dict(model_type="bart"), "model_type='bart'"),
    (dict(scale_embedding=False), "scale_embedding=False"),
    (dict(normalize_before=True), "normalize_before=True"),
    (dict(activation_function="tanh"), "activation_function='tanh'"),
    (dict(decoder_start_token_id=5), "decoder_start_token_id=5: the decoder "
     "starts from <pad>'s zero vector (pad_token_id=59) or from the first "
     "piece after the specials (2) here"),
])
def test_refusals_name_the_setting(tmp_path, change, needle):
  _save(str(tmp_path))
  path = tmp_path / "config.json"
  config = json.loads(path.read_text())
  config.update(change)
  path.write_text(json.dumps(config))
  with pytest.raises(ValueError) as error:
    marian.from_transformers(str(tmp_path))
  assert needle in str(error.value)
  assert len(str(error.value).splitlines()) == 1


def test_a_deep_encoder_and_shallow_decoder_import_and_export_back(
    tmp_path):
  """A 6-2 MarianMTModel (as OPUS-MT's tiny students are): each stack
  imports at its own depth, every token's log-probabilities equal
  Transformers' (within both's float32 bounds, rounding.py), and the
  export writes the depths back."""
  published = tmp_path / "published"
  published.mkdir()
  theirs_model, vocab = _save_with_tokenizer(str(published), encoder_layers=6,
                                             decoder_layers=2)
  pad = len(vocab) - 1
  imported = marian.from_transformers(str(published))
  config = imported.model.config.model
  assert (config.num_encoder_layers, config.num_decoder_layers) == (6, 2)
  named = imported.model.named_weights()
  assert (len(named.encoder.layers), len(named.decoder.layers)) == (6, 2)
  rng = np.random.default_rng(1)
  sources, targets = zip(*(
      (np.append(rng.integers(2, pad, rng.integers(2, 12)), EOS),
       np.append(rng.integers(1, pad, rng.integers(1, 12)), EOS))
      for _ in range(20)))
  _teacher_forced(theirs_model, imported, sources, targets, pad)
  # Imported as a run and exported back: the depths, and the weights bit
  # for bit.
  from tf_transformer.run import loading  # pylint: disable=g-import-not-at-top
  from tf_transformer.run.import_run import import_marian  # pylint: disable=g-import-not-at-top
  from tf_transformer.run.runner import Runner  # pylint: disable=g-import-not-at-top
  run = str(tmp_path / "run")
  import_marian(str(published), run)
  back = Runner(run).export(str(tmp_path / "back"), format="transformers")
  with open(os.path.join(back, "config.json"), encoding="utf-8") as f:
    config = json.load(f)
  assert (config["encoder_layers"], config["decoder_layers"]) == (6, 2)
  again = marian.from_transformers(back).model
  for a, b in zip(loading.trained(run)[0].get_weights(), again.get_weights()):
    np.testing.assert_array_equal(a, b)


def test_bad_files_are_refused(tmp_path):
  _save(str(tmp_path))
  weights = tmp_path / "model.safetensors"
  weights.write_bytes(weights.read_bytes()[:1000])
  with pytest.raises(ValueError, match="model.safetensors: unreadable"):
    marian.from_transformers(str(tmp_path))
  vocab = json.loads((tmp_path / "vocab.json").read_text())
  del vocab["p7"]
  (tmp_path / "vocab.json").write_text(json.dumps(vocab))
  with pytest.raises(ValueError, match="vocab.json: 59 pieces, but "
                     "config.json's vocab_size is 60"):
    marian.from_transformers(str(tmp_path))
  (tmp_path / "vocab.json").unlink()
  with pytest.raises(ValueError, match="vocab.json: missing"):
    marian.from_transformers(str(tmp_path))


SENTENCES = ["the cat sat on the mat", "a dog ran in the park",
             "the bird sang a song", "two cats and a dog", "a red ball",
             "the park is green", "she reads a book", "the sun is hot"] * 4


def _spm(sentences):
  import io  # pylint: disable=g-import-not-at-top
  import sentencepiece as spm  # pylint: disable=g-import-not-at-top
  model = io.BytesIO()
  spm.SentencePieceTrainer.train(
      sentence_iterator=iter(sentences), model_writer=model, vocab_size=40,
      model_type="unigram", hard_vocab_limit=False, minloglevel=2)
  return model.getvalue()


# Target-language tokens of a multilingual model (opus-mt-en-ROMANCE).
LANGUAGE_CODES = [">>fra<<", ">>por<<"]


def _save_with_tokenizer(directory, **overrides):
  """`_save`'s model (with `overrides` of its config) with OPUS-MT's
  tokenizer files: source.spm, target.spm and a joint vocab.json of their
  pieces (Marian's order)."""
  import sentencepiece as spm  # pylint: disable=g-import-not-at-top
  protos = {"source.spm": _spm(SENTENCES),
            "target.spm": _spm([s.upper() for s in SENTENCES])}
  pieces = []
  for proto in protos.values():
    processor = spm.SentencePieceProcessor(model_proto=proto)
    pieces += [processor.id_to_piece(i)
               for i in range(processor.get_piece_size())
               if not (processor.is_control(i) or processor.is_unknown(i))]
  pieces = sorted(set(pieces) | set(LANGUAGE_CODES))
  vocab = {"</s>": 0, "<unk>": 1,
           **{p: i + 2 for i, p in enumerate(pieces)}}
  vocab["<pad>"] = len(vocab)
  model = _save(directory, vocab_size=len(vocab), **overrides)
  for name, proto in protos.items():
    with open(os.path.join(directory, name), "wb") as f:
      f.write(proto)
  with open(os.path.join(directory, "vocab.json"), "w") as f:
    json.dump(vocab, f)
  return model, vocab


FRESH_LOAD = r"""
import json, sys
import tensorflow as tf
import tensorflow_text  # registers the SentencePiece ops
serve = tf.saved_model.load(sys.argv[1]).signatures["serving_default"]
out = serve(text=tf.constant(json.loads(sys.argv[2])))["translation"]
print(json.dumps([t.decode() for t in out.numpy()]))
"""


@pytest.mark.slow
def test_imported_run_translates_text_as_transformers(tmp_path):
  """bin/import_model.py writes a run; its SavedModel (text in,
  translation out, the Marian tokenizer in the graph) translates as
  Transformers' MarianTokenizer + generate, greedy, and scores targets cut
  by the target language's SentencePiece model."""
  import subprocess  # pylint: disable=g-import-not-at-top
  import sys  # pylint: disable=g-import-not-at-top
  from tf_transformer.run.runner import Runner  # pylint: disable=g-import-not-at-top
  published = tmp_path / "published"
  published.mkdir()
  theirs_model, vocab = _save_with_tokenizer(str(published))
  tokenizer = transformers.MarianTokenizer(
      str(published / "source.spm"), str(published / "target.spm"),
      str(published / "vocab.json"))
  run = tmp_path / "run"
  result = run_script("import_model.py", f"--from={published}",
                      f"--model_dir={run}")
  assert result.returncode == 0, result.stderr
  assert f"wrote {run}" in result.stdout
  again = run_script("import_model.py", f"--from={published}",
                      f"--model_dir={run}")
  assert again.returncode == 2
  assert "exists" in again.stderr.strip().splitlines()[-1]
  export = Runner(str(run)).export(str(tmp_path / "export"),
                                   method="greedy",
                                   max_decode_length_offset=8)
  serve = tf.saved_model.load(export).signatures["serving_default"]
  texts = SENTENCES[:8] + ["the cat ran", "a zebra!", ">>fra<< the cat"]
  ours = [t.decode() for t in serve(text=tf.constant(texts))[
      "translation"].numpy()]
  # As TF Serving would: a fresh process with only tensorflow and
  # tensorflow-text, and only their ops in the graph.
  fresh = subprocess.run(
      [sys.executable, "-c", FRESH_LOAD, export, json.dumps(texts)],
      capture_output=True, text=True, check=False)
  assert fresh.returncode == 0, fresh.stderr[-2000:]
  assert json.loads(fresh.stdout.splitlines()[-1]) == ours
  from test_export import _all_ops  # pylint: disable=g-import-not-at-top
  from tensorflow.python.framework import op_def_registry  # pylint: disable=g-import-not-at-top
  ops, functions = _all_ops(export)
  defined = {f.signature.name for f in functions}
  assert not {op for op in ops if op not in defined and
              op_def_registry.get(op) is None}
  assert not ops & {"PyFunc", "PyFuncStateless", "EagerPyFunc"}
  from tf_transformer.run import loading  # pylint: disable=g-import-not-at-top
  model, vocabulary, _ = loading.trained(str(run), None, method="greedy")
  source_ids = [row + [special_ids.EOS_ID] for row in vocabulary.processor(
      "source").encode(texts)]
  apart = []
  for line, (text, translation) in enumerate(zip(texts, ours)):
    encoded = tokenizer([text], return_tensors="pt")
    with torch.no_grad():
      out = theirs_model.generate(
          **encoded, do_sample=False, num_beams=1,
          bad_words_ids=[[vocab["<pad>"]]], forced_eos_token_id=None,
          max_new_tokens=encoded["input_ids"].shape[1] + 8)
    if translation != tokenizer.decode(out[0], skip_special_tokens=True):
      apart.append(line)
  # Two engines: apart only where greedy decoding met a decision within
  # their float32 rounding (tests/search_reference.py).
  search_reference.assert_near_ties(model, source_ids, apart, beam_size=1,
                                    max_length_offset=8)
  # Scored targets are cut by the target language's SentencePiece model.
  import sentencepiece as spm  # pylint: disable=g-import-not-at-top
  target_spm = spm.SentencePieceProcessor(
      model_file=str(published / "target.spm"))
  targets = ["THE CAT SAT", "A DOG RAN IN THE PARK"]
  scored = tf.saved_model.load(export).signatures["score"](
      source=tf.constant(texts[:2]), target=tf.constant(targets))
  assert scored["lengths"].numpy().tolist() == [
      len(target_spm.encode(t)) + 1 for t in targets]
  assert np.all(np.isfinite(scored["log_prob"].numpy()))
  # Its CTranslate2 export scores as the SavedModel (<pad> stays in the
  # softmax as in Transformers: CTranslate2's own converter drops it).
  from tf_transformer.translators.ct2_runtime import CT2Decoder  # pylint: disable=g-import-not-at-top
  ct2 = CT2Decoder(Runner(str(run)).export(
      str(tmp_path / "ct2"), format="ctranslate2", method="greedy",
      max_decode_length_offset=8))
  # Two engines, each within its float32 bound (rounding.py).
  target_ids = [row + [special_ids.EOS_ID] for row in vocabulary.processor(
      "target").encode(targets)]
  _, bound = rounding.token_bounds(model, source_ids[:2], target_ids)
  rounding.assert_within(
      [sum(t) for t in ct2.token_log_probs(texts[:2], targets)],
      scored["log_prob"].numpy(), 2 * bound[:, -1])


def test_tokens_equal_marian_tokenizer_with_language_codes(tmp_path):
  """Source and target text become the ids Transformers' `MarianTokenizer`
  gives (in our order): a leading ">>fra<<" is one piece (an unknown one
  <unk>), anywhere else it is text for SentencePiece."""
  from tf_transformer.data.marian_vocabulary import MarianVocabulary  # pylint: disable=g-import-not-at-top
  _save_with_tokenizer(str(tmp_path))
  tokenizer = transformers.MarianTokenizer(
      str(tmp_path / "source.spm"), str(tmp_path / "target.spm"),
      str(tmp_path / "vocab.json"))
  ours = MarianVocabulary.from_files(str(tmp_path))
  texts = [">>fra<< the cat sat", ">>por<<a dog", ">>xyz<< a dog",
           "the >>fra<< cat", ">>fra<<", "the cat", ""]
  theirs = tokenizer(texts)["input_ids"]
  target_theirs = tokenizer(text_target=[t.upper() for t in texts])[
      "input_ids"]
  tokens = ours.make_tokenizer()
  for got, want in ((tokens.tokenize(texts), theirs),
                    (tokens.target.tokenize([t.upper() for t in texts]),
                     target_theirs)):
    got = [ours.order[row].tolist() for row in got.numpy()]
    assert got == [row[:-1] for row in want]  # theirs end with </s>
  assert ours.order[tokens.tokenize(texts[0]).numpy()].tolist() == (
      theirs[0][:-1])  # a single string as a batch of one
  # A training corpus is cut in Python (token_store) into the same ids.
  for side, want in (("source", theirs), ("target", target_theirs)):
    lines = texts if side == "source" else [t.upper() for t in texts]
    got = ours.processor(side).encode(lines)
    assert [ours.order[row].tolist() for row in got] == [
        row[:-1] for row in want]


def test_pytorch_weights_only_with_torch(tmp_path, monkeypatch):
  """pytorch_model.bin (older releases) is read with torch's weights_only
  loader where torch is installed, and refused in one line where not."""
  theirs_model = _save(str(tmp_path))
  (tmp_path / "model.safetensors").unlink()
  torch.save(theirs_model.state_dict(), str(tmp_path / "pytorch_model.bin"))
  from_bin = marian.from_transformers(str(tmp_path))
  source, target = next(_pairs(1))
  ours_id = np.argsort(from_bin.order)
  with torch.no_grad():
    logits = theirs_model(input_ids=torch.tensor(source[None]),
                          labels=torch.tensor(target[None])).logits
  ours = _log_softmax(from_bin.model((
      ours_id[source][None],
      np.concatenate([[special_ids.BOS_ID], ours_id[target[:-1]]])[None])))
  _assert_within_rounding(from_bin.model, [ours_id[source]],
                          [ours_id[target]], ours,
                          torch.log_softmax(logits, -1).numpy(), ours_id)
  monkeypatch.setitem(__import__("sys").modules, "torch", None)
  with pytest.raises(ValueError) as error:
    marian.from_transformers(str(tmp_path))
  assert "pytorch_model.bin: reading it needs torch" in str(error.value)
  assert len(str(error.value).splitlines()) == 1
