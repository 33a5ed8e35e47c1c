"""bin/export.py --format=transformers (interop/marian.py): a
MarianMTModel directory that Transformers' MarianTokenizer and
MarianMTModel load with no code of ours, computing what our model computes;
an imported Marian model exports back, and an export imports to the same
weights."""

import json
import os

import keras
import numpy as np
import pytest
import tensorflow as tf
import torch
import transformers
from num2words import num2words
from safetensors import safe_open
from safetensors.numpy import load_file

import sentencepiece as spm

from conftest import run_script
import rounding
import search_reference
from training_helpers import vocabulary
from tf_transformer import build_model
from tf_transformer import get_config
from tf_transformer import special_ids
from tf_transformer.decoding import search
from tf_transformer.run import loading
from tf_transformer.run.runner import Runner
from tf_transformer.interop import marian

# Transformers' layer normalization adds 1e-5 to the variance, ours 1e-6:
# another function by that much, on top of two engines' rounding
# (rounding.exact_next_log_probs).
THEIR_EPSILON = 1e-5

pytestmark = pytest.mark.numeric


def _model(overrides=""):
  """A tiny model of the numbers vocabulary, its weights spread so that
  its outputs are far from uniform."""
  keras.utils.set_random_seed(7)
  config = get_config("tiny", ",".join(filter(None, [
      "num_layers=2,d_model=32,d_ff=64,num_heads=4", overrides])),
      vocab_size=vocabulary().vocab_size)
  model = build_model(config)
  model((tf.constant([[5, 3]]), tf.constant([[2, 5]])))
  rng = np.random.default_rng(0)
  model.set_weights([w + rng.normal(0, 0.3, w.shape).astype(w.dtype)
                     for w in model.get_weights()])
  return model


def _export(model, directory, beam_size=4):
  return marian.export(
      model, vocabulary(), str(directory),
      search.DecodingOptions(beam_size=beam_size))


def _load(directory):
  theirs, info = transformers.MarianMTModel.from_pretrained(
      str(directory), output_loading_info=True)
  assert not any(info.values()), info  # nothing missing, unexpected, resized
  return theirs.eval()


def _pairs(count, vocab_size, seed=0):
  rng = np.random.default_rng(seed)
  for _ in range(count):
    source = np.append(rng.integers(4, vocab_size, rng.integers(2, 12)),
                       special_ids.EOS_ID)
    target = np.append(rng.integers(4, vocab_size, rng.integers(1, 12)),
                       special_ids.EOS_ID)
    yield source, target


def _assert_same_log_probs(ours, theirs, start):
  """The two models' log-probabilities over the real positions of 12
  pairs, run as one padded batch (a source's padding masked, a target's
  after its end): each engine within its float32 bound (rounding.py) of
  the exact values of its own function (its layer norms' epsilon)."""
  sources, targets = zip(*_pairs(12, ours.config.model.vocab_size))
  padded = lambda rows: keras.utils.pad_sequences(
      rows, padding="post", value=special_ids.PAD_ID)
  source_ids = padded(sources)
  decoder_input = padded([np.concatenate([[start], t[:-1]]) for t in targets])
  with torch.no_grad():
    logits = theirs(input_ids=torch.tensor(source_ids),
                    attention_mask=torch.tensor(
                        source_ids != special_ids.PAD_ID),
                    decoder_input_ids=torch.tensor(decoder_input)).logits
  expected = torch.log_softmax(logits, -1).numpy()
  got = tf.nn.log_softmax(ours((source_ids, decoder_input))).numpy()
  assert np.isfinite(expected).all() and np.isfinite(got).all()
  cells = [(row, t) for row, target in enumerate(targets)
           for t in range(len(target))]
  rows = [list(sources[row]) for row, _ in cells]
  prefixes = [list(targets[row][:t]) for row, t in cells]
  _, bound = rounding.vocabulary_log_prob_bounds(ours, rows, prefixes)
  other_function = np.abs(
      rounding.exact_next_log_probs(ours, rows, prefixes)
      - rounding.exact_next_log_probs(ours, rows, prefixes, THEIR_EPSILON))
  rounding.assert_within(np.stack([got[r, t] for r, t in cells]),
                         np.stack([expected[r, t] for r, t in cells]),
                         2 * bound + other_function)


# The paper's model in the quick tier; the other options (the same export)
# in the slow tier.
@pytest.mark.parametrize("overrides", [
    "",  # the paper's: interleaved sinusoids, shared, ReLU
    pytest.param("share_embeddings=false,activation=swish,output_bias=true",
                 marks=pytest.mark.slow),
    pytest.param("positional_encoding=sinusoidal_halves,activation=gelu",
                 marks=pytest.mark.slow),
    pytest.param("num_encoder_layers=3,num_decoder_layers=1",  # a student's
                 marks=pytest.mark.slow),
])
def test_log_probs_equal_ours(tmp_path, overrides):
  model = _model(overrides)
  path = _export(model, tmp_path / "hf")
  theirs = _load(path)
  _assert_same_log_probs(model, theirs, special_ids.BOS_ID)
  config = json.loads((tmp_path / "hf" / "config.json").read_text())
  assert (config["encoder_layers"], config["decoder_layers"]) == (
      model.config.model.num_encoder_layers,
      model.config.model.num_decoder_layers)
  generation = json.loads(
      (tmp_path / "hf" / "generation_config.json").read_text())
  for ids in (config, generation):
    assert ids["decoder_start_token_id"] == special_ids.BOS_ID
    assert ids["eos_token_id"] == special_ids.EOS_ID
    assert ids["forced_eos_token_id"] is None  # ours cut at the limit
    assert ids["pad_token_id"] == special_ids.PAD_ID
  assert generation["bad_words_ids"] == [[special_ids.PAD_ID],
                                         [special_ids.BOS_ID]]
  assert generation["num_beams"] == 4
  metadata = safe_open(str(tmp_path / "hf" / "model.safetensors"),
                       "np").metadata()
  assert metadata == {"format": "pt"}


def test_the_interleaved_sinusoids_are_a_permutation_of_the_halves():
  """Section 3.5's table with its columns permuted is Transformers' own."""
  from transformers.models.marian.modeling_marian import (  # pylint: disable=g-import-not-at-top
      MarianSinusoidalPositionalEmbedding)
  from tf_transformer.layers.embedding import sinusoid_table  # pylint: disable=g-import-not-at-top
  d_model = 32
  ours = sinusoid_table(np.arange(50), d_model).numpy()
  theirs = MarianSinusoidalPositionalEmbedding(50, d_model).create_weight()
  order = marian.interleaved_to_halves(d_model)
  # Ours computes the angles in float32, Transformers' in float64 (then
  # rounded to float32): ours within (FUNCTION + 2) u of each angle, FUNCTION
  # of the sine and one of the result; theirs one rounding.
  two_i = np.arange(0, d_model, 2)
  angles = np.arange(50)[:, None] / 10000 ** (two_i / d_model)
  angles = np.repeat(angles, 2, axis=1)[:, order]
  rounding.assert_within(ours[:, order], theirs.numpy(), (
      (rounding.FUNCTION + 2) * angles + rounding.FUNCTION + 2) * rounding.U32)


@pytest.mark.slow
def test_command_exports_a_trained_run_that_translates_as_ours(
    trained_numbers_run, tmp_path):
  """bin/export.py --format=transformers on a trained run loads in
  Transformers by its Auto classes; benchmarks/compare_transformers.py then
  finds MarianTokenizer's ids equal to ours, the same per-token
  log-probabilities, and greedy generate() giving our greedy search's tokens
  and text, sentence for sentence."""
  out = tmp_path / "numbers_hf"
  result = run_script("export.py", f"--model_dir={trained_numbers_run}",
                      "--format=transformers", f"--export_dir={out}")
  assert result.returncode == 0, result.stderr[-3000:]
  assert f"exported {out} (" in result.stdout
  assert sorted(os.listdir(out)) == [
      "config.json", "generation_config.json", "model.safetensors",
      "source.spm", "target.spm", "tokenizer_config.json", "vocab.json"]
  tokenizer = transformers.AutoTokenizer.from_pretrained(str(out))
  assert isinstance(tokenizer, transformers.MarianTokenizer)
  _load(out)
  numbers = np.random.default_rng(0).integers(0, 1_000_000, 20)
  source, reference = tmp_path / "test.en", tmp_path / "test.de"
  source.write_text("".join(f"{num2words(n)}\n" for n in numbers))
  reference.write_text("".join(f"{num2words(n, lang='de')}\n"
                               for n in numbers))
  result = run_script("benchmarks/compare_transformers.py",
                      f"--model_dir={trained_numbers_run}",
                      f"--source={source}", f"--reference={reference}",
                      "--beam_size=2", f"--export_dir={tmp_path / 'again'}")
  assert result.returncode == 0, result.stderr[-3000:]
  lines = result.stdout.splitlines()
  assert "MarianTokenizer's ids equal ours: 20/20" in lines
  gap = float(next(line for line in lines if "largest gap" in line).split()[-1])
  # Each engine within its float32 bound (rounding.py) of its own exact
  # function (the layer norms' epsilon), token by token: the largest gap
  # within the largest such allowance.
  model, vocab = loading.trained(str(trained_numbers_run))[:2]
  processor = spm.SentencePieceProcessor(model_proto=vocab.model_proto)
  sources = [ids + [special_ids.EOS_ID] for ids in processor.encode(
      [num2words(n) for n in numbers])]
  targets = [ids + [special_ids.EOS_ID] for ids in processor.encode(
      [num2words(n, lang="de") for n in numbers])]
  here, bound = rounding.token_bounds(model, sources, targets)
  there = rounding.exact_token_log_probs(model, sources, targets,
                                         THEIR_EPSILON)
  assert gap <= np.max(2 * bound[:, :-1] + np.abs(here[:, :-1] - there))
  # Greedy: the same tokens but where the search met a decision within
  # both's rounding and the two functions' difference
  # (tests/search_reference.py).
  offset = model.config.decoding.max_decode_length_offset
  results = search_reference.search(model, sources, beam_size=1,
                                    max_length_offset=offset)
  may_differ = sum(search_reference.near_tie(model, source, result,
                                             epsilon=THEIR_EPSILON)
                   for source, result in zip(sources, results))
  greedy = next(line for line in lines if line.startswith("greedy: "))
  same = int(greedy.split("identical tokens ")[1].split("/")[0])
  assert same >= 20 - may_differ, (greedy, may_differ)
  assert any(line.startswith("beam 2, no length penalty: BLEU ours ")
             for line in lines), result.stdout


@pytest.mark.parametrize("overrides,needle", [
    ("norm_position=pre", "norm_position='pre': Transformers' MarianMTModel "
     "is post-norm only"),
    ("positional_encoding=learned", "positional_encoding='learned'"),
    ("d_k=4", "d_k=4 with num_heads=4, d_model=32"),
])
def test_what_marian_cannot_hold_is_refused_and_nothing_written(
    tmp_path, overrides, needle):
  with pytest.raises(ValueError) as refused:
    _export(_model(overrides), tmp_path / "hf")
  assert str(refused.value).startswith("--format=transformers: " + needle)
  assert "\n" not in str(refused.value)
  assert not os.listdir(tmp_path)


def test_flags_it_cannot_take_are_refused(trained_numbers_run, tmp_path):
  for flag, needle in (("--dtype=bfloat16", "a Transformers model is "
                        "float32"),
                       ("--shortlist=2,10", "a Transformers model has no "
                        "vocabulary shortlist")):
    result = run_script("export.py", f"--model_dir={trained_numbers_run}",
                        "--format=transformers", flag,
                        f"--export_dir={tmp_path / 'hf'}")
    assert result.returncode == 1, result.stderr
    assert needle in result.stderr.splitlines()[-1]
  assert not (tmp_path / "hf").exists()


def _published(directory):
  """A tiny OPUS-MT-like MarianMTModel with its tokenizer files."""
  from test_marian_import import _save_with_tokenizer  # pylint: disable=g-import-not-at-top
  directory.mkdir()
  theirs, _ = _save_with_tokenizer(str(directory))
  return theirs.eval()


def test_an_imported_marian_model_exports_back_and_imports_bit_for_bit(
    tmp_path):
  """import -> export: the same function as the published model (ids
  renumbered by vocab.json); export -> import: the same weights, bit for
  bit."""
  published = _published(tmp_path / "published")
  run = tmp_path / "run"
  assert run_script("import_model.py", f"--from={tmp_path / 'published'}",
                    f"--model_dir={run}").returncode == 0
  exported = Runner(str(run)).export(str(tmp_path / "back"),
                                     format="transformers")
  theirs = _load(exported)
  tokenizer = transformers.MarianTokenizer.from_pretrained(exported)
  original = transformers.MarianTokenizer(
      str(tmp_path / "published" / "source.spm"),
      str(tmp_path / "published" / "target.spm"),
      str(tmp_path / "published" / "vocab.json"))
  for text in ("the cat sat on the mat", ">>fra<< a dog ran"):
    new, old = tokenizer([text], return_tensors="pt"), original(
        [text], return_tensors="pt")
    with torch.no_grad():
      a = published.generate(**old, do_sample=False, num_beams=1,
                             max_new_tokens=10)
      b = theirs.generate(**new, do_sample=False, num_beams=1,
                          max_new_tokens=10)
    assert original.decode(a[0], skip_special_tokens=True) == (
        tokenizer.decode(b[0], skip_special_tokens=True))
  imported = marian.from_transformers(exported)
  assert list(imported.order) == list(range(len(imported.order)))
  ours, _, _ = loading.trained(str(run))
  for a, b in zip(ours.get_weights(), imported.model.get_weights()):
    np.testing.assert_array_equal(a, b)


def test_an_export_of_the_papers_model_imports_to_its_weights_permuted(
    tmp_path):
  model = _model()
  path = _export(model, tmp_path / "hf")
  imported = marian.from_transformers(path)
  assert imported.model.config.model.decoder_start == "bos"
  assert imported.model.config.model.positional_encoding == (
      "sinusoidal_halves")
  again = _export(imported.model, tmp_path / "again")
  first, second = (load_file(os.path.join(p, "model.safetensors"))
                   for p in (path, again))
  assert sorted(first) == sorted(second)
  for name, value in first.items():
    np.testing.assert_array_equal(value, second[name], err_msg=name)
