"""Decoding with a target prefix (`translate_with_prefix`, bin/translate.py
--target_prefix): outputs start with the prefix, an empty prefix gives
exactly the plain translation, and scores stay the model's."""

import numpy as np
import pytest
import sentencepiece as spm
import tensorflow as tf
import tensorflow_text  # noqa: F401  (registers the ops the graph uses)

from tf_transformer.data import numbers
from tf_transformer.data import sequences
from tf_transformer.decoding import prefix as prefix_lib
from tf_transformer.decoding.beam_search import length_penalty
from tf_transformer.decoding.scoring import token_log_probs
from tf_transformer.decoding.search import DecodingOptions
from tf_transformer.decoding.search import decode
from tf_transformer.serving.translation_module import TranslationModule
from tf_transformer.run import run_dir
from tf_transformer.special_ids import EOS_ID, PAD_ID
from conftest import load_saved_model, run_script
import rounding
import search_reference

PAIRS = numbers.generate({"test": 16}, seed=5)["test"]
SOURCES = [s for s, _ in PAIRS]
REFERENCES = [t for _, t in PAIRS]


def _strings(values):
  return tf.constant(values, tf.string, shape=[len(values)])


def _prefixes(vocab, texts, pieces):
  """The first `pieces` subwords of each text, as text."""
  processor = spm.SentencePieceProcessor(model_proto=vocab.model_proto)
  return [processor.decode(p[:pieces]) for p in
          processor.encode(texts, out_type=str)]


@pytest.fixture(scope="module")
def loaded(trained_export):
  return load_saved_model(trained_export)


def test_empty_prefix_gives_exactly_the_plain_translation(loaded):
  plain = loaded.signatures["serving_default"](text=_strings(SOURCES))
  out = loaded.signatures["translate_with_prefix"](
      text=_strings(SOURCES), prefix=_strings([""] * len(SOURCES)))
  np.testing.assert_array_equal(out["translation"], plain["translation"])
  np.testing.assert_array_equal(out["score"], plain["score"])


@pytest.mark.numeric
def test_outputs_start_with_the_prefix_and_keep_the_models_scores(
    trained_numbers_run, loaded):
  model, vocab = run_dir.load_trained_model(str(trained_numbers_run))
  # Another sentence's first subwords: a prefix the model would not choose.
  prefixes = _prefixes(vocab, REFERENCES[1:] + REFERENCES[:1], 2)
  out = loaded.signatures["translate_with_prefix"](
      text=_strings(SOURCES), prefix=_strings(prefixes))
  translations = [t.decode() for t in out["translation"].numpy()]
  assert all(t.startswith(p) for t, p in zip(translations, prefixes))
  plain = loaded.signatures["serving_default"](text=_strings(SOURCES))
  # Wrong prefixes cost probability (not on every line: beam search is
  # not exact, and a forced start can lead it to a better hypothesis; 5.0
  # to 6.4 a sentence on average on 9 numbers models).
  assert np.mean(out["score"]) < np.mean(plain["score"]) - 1.0

  # The same search in process, as the export was made (beam 4, inputs
  # cut to 24 subwords, outputs of input + 10), gives the subwords behind
  # each translation and the same scores.
  module = TranslationModule(model, vocab, DecodingOptions(
      max_decode_length_offset=10), max_input_tokens=24)
  source_ids = module.source_ids(_strings(SOURCES))["source_ids"]
  forced = prefix_lib.from_ragged(
      sequences.subwords(module.tokenizer, _strings(prefixes)))
  ids, scores = tf.function(lambda s: decode(
      model, s, module.options, step_weights=module.step_weights,
      prefix=forced))(source_ids)
  target = tf.RaggedTensor.from_tensor(ids[:, 0], padding=PAD_ID)
  # In process and the export: two paths, apart only at near ties of the
  # search (tests/search_reference.py); every score within both paths'
  # float32 bounds (rounding.py). Here and below the bounds are of the
  # in-process outputs, EOS included.
  processor = spm.SentencePieceProcessor(model_proto=vocab.model_proto)
  sources = rounding.unpadded(source_ids)
  outputs = rounding.unpadded(ids[:, 0])
  translations = [t.decode() for t in module.tokenizer.detokenize(
      target).numpy()]
  exported = [t.decode() for t in out["translation"].numpy()]
  apart = search_reference.lines_apart(
      model, sources, [[processor.encode(t)] for t in translations],
      [[processor.encode(t)] for t in exported], max_length_offset=10,
      prefixes=processor.encode(prefixes))
  same = np.array([line not in apart for line in range(len(SOURCES))])
  assert same.mean() > 0.5
  bound = 2 * rounding.output_bounds(model, sources, outputs)
  rounding.assert_within(scores[:, 0].numpy()[same],
                         np.asarray(out["score"])[same], bound[same])
  # Each score is the model's log P(those subwords, EOS included) over the
  # length penalty, the forced subwords' probabilities included.
  log_probs = token_log_probs(model, source_ids, target)
  penalty = length_penalty(tf.cast(target.row_lengths(), tf.float32), 0.6)
  rounding.assert_within(scores[:, 0], tf.reduce_sum(log_probs, axis=1)
                         / penalty, bound)
  # The `score` signature reads text, which re-segments: where the text's
  # subwords are the search's own, it gives the same figure. (A search may
  # output a segmentation the tokenizer would not choose, "zig" + "tausend"
  # for "zigtausend", which is another sequence with its own probability.)
  scored = loaded.signatures["score"](source=_strings(SOURCES),
                                      target=out["translation"])
  resegmented = sequences.labels(sequences.subwords(
      module.tokenizer, out["translation"]))
  _, scored_bound = rounding.sentence_bounds(model, sources,
                                             resegmented.to_list())
  rounding.assert_within(
      scored["log_prob"],
      tf.reduce_sum(token_log_probs(model, source_ids, resegmented), 1),
      2 * scored_bound)
  same &= [list(a) == list(b) for a, b in
           zip(resegmented.to_list(), target.to_list())]
  penalty = length_penalty(tf.cast(scored["lengths"], tf.float32), 0.6)
  rounding.assert_within(np.asarray(out["score"])[same],
                         np.asarray(scored["log_prob"] / penalty)[same],
                         bound[same])


def _functions(concrete):
  """Every function a traced signature's graph holds."""
  return concrete.graph.as_graph_def().library.function


@pytest.mark.numeric
@pytest.mark.parametrize("how", [
    pytest.param(dict(xla=True), marks=pytest.mark.slow), dict(decode_parts=2)])
def test_an_xla_or_parts_export_decodes_prefixes_its_way(trained_numbers_run,
                                                        how):
  """A prefix request goes through the export's own search: compiled by XLA
  for an --xla export, as parallel parts for --decode_parts; the same
  translations as the plain export's but where rounding can tip a decision,
  and the same scores."""
  model, vocab = run_dir.load_trained_model(str(trained_numbers_run))
  options = DecodingOptions(max_decode_length_offset=10)
  prefixes = _prefixes(vocab, REFERENCES[1:] + REFERENCES[:1], 2)
  prefixes[:3] = [""] * 3
  outputs, traced = [], None
  for kwargs in ({}, how):
    module = TranslationModule(model, vocab, options, max_input_tokens=24,
                               **kwargs)
    outputs.append(module.translate_with_prefix(_strings(SOURCES),
                                                _strings(prefixes)))
    traced = module.translate_with_prefix.get_concrete_function()
    if not kwargs:  # the plain search's own subwords, for the bounds
      source_ids = module.source_ids(_strings(SOURCES))["source_ids"]
      searched = rounding.unpadded(decode(
          model, source_ids, options, step_weights=module.step_weights,
          prefix=prefix_lib.from_ragged(sequences.subwords(
              module.tokenizer, _strings(prefixes))))[0][:, 0])
  functions = _functions(traced)
  if "xla" in how:
    assert any(f.attr["_XlaMustCompile"].b for f in functions
               if "_XlaMustCompile" in f.attr)
  else:  # one search loop a part
    assert sum("while_body" in f.signature.name and "decoder_step" in str(f)
               for f in functions) == 2
  plain, other = outputs
  processor = spm.SentencePieceProcessor(model_proto=vocab.model_proto)
  subwords = lambda out: [[processor.encode(t.decode())]
                          for t in out["translation"].numpy()]
  sources = [ids + [EOS_ID] for ids in processor.encode(SOURCES)]
  forced = processor.encode(prefixes)
  apart = search_reference.lines_apart(model, sources, subwords(plain),
                                       subwords(other), max_length_offset=10,
                                       prefixes=forced)
  same = [line not in apart for line in range(len(SOURCES))]
  assert all(t.decode().startswith(p) for t, p in zip(
      other["translation"].numpy(), prefixes))
  # Two paths, each within its float32 bound (rounding.py).
  bound = 2 * rounding.output_bounds(model, rounding.unpadded(source_ids),
                                     searched)
  same = np.array(same)
  rounding.assert_within(np.asarray(other["score"])[same],
                         np.asarray(plain["score"])[same], bound[same])


@pytest.mark.parametrize("method", ["greedy", "sample"])
def test_left_to_right_searches_take_a_prefix_too(trained_numbers_run,
                                                  method):
  model, vocab = run_dir.load_trained_model(str(trained_numbers_run))
  module = TranslationModule(model, vocab, DecodingOptions(
      method=method, seed=1 if method == "sample" else None,
      max_decode_length_offset=10))
  prefixes = _prefixes(vocab, REFERENCES[::-1], 3)
  out = module.translate_with_prefix(_strings(SOURCES), _strings(prefixes))
  assert all(t.decode().startswith(p)
             for t, p in zip(out["translation"].numpy(), prefixes))
  if method == "greedy":
    plain = module.serve(_strings(SOURCES))
    empty = module.translate_with_prefix(_strings(SOURCES),
                                         _strings([""] * len(SOURCES)))
    np.testing.assert_array_equal(empty["translation"], plain["translation"])


def test_odd_requests_get_defined_answers(loaded):
  signature = loaded.signatures["translate_with_prefix"]
  empty = signature(text=_strings([]), prefix=_strings([]))
  assert empty["translation"].shape == (0,) and empty["score"].shape == (0,)
  # A prefix longer than the output limit (input + 10) is cut to it.
  out = signature(text=_strings(["seven", ""]),
                  prefix=_strings(["sieben " * 50, "\xff"]))
  assert out["translation"].shape == (2,)
  assert np.all(np.isfinite(out["score"]))
  with pytest.raises(tf.errors.InvalidArgumentError,
                     match="text and prefix must hold as many strings"):
    signature(text=_strings(["seven", "eight"]), prefix=_strings(["s"]))


@pytest.mark.slow
@pytest.mark.numeric
def test_bin_translate_target_prefix(trained_export, trained_numbers_run,
                                     tmp_path):
  model, vocab = run_dir.load_trained_model(str(trained_numbers_run))
  prefixes = _prefixes(vocab, REFERENCES[:4], 2)
  prefixes[1] = ""
  source, prefix_file = tmp_path / "source.txt", tmp_path / "prefix.txt"
  source.write_text("".join(s + "\n" for s in SOURCES[:4]), encoding="utf-8")
  prefix_file.write_text("".join(p + "\n" for p in prefixes),
                         encoding="utf-8")
  result = run_script("translate.py", f"--model={trained_export}",
                      f"--input={source}", f"--target_prefix={prefix_file}")
  assert result.returncode == 0, result.stderr[-2000:]
  lines = result.stdout.splitlines()
  assert len(lines) == 4
  assert all(line.startswith(p) for line, p in zip(lines, prefixes))
  # Translated a line at a time (batches of other shapes), each line still
  # gets its own prefix: the same lines but at near ties of the search
  # (tests/search_reference.py); so does the empty prefix's line, against
  # the plain search.
  one_by_one = run_script("translate.py", f"--model={trained_export}",
                          f"--input={source}", "--buffer_lines=1",
                          f"--target_prefix={prefix_file}")
  assert one_by_one.returncode == 0, one_by_one.stderr[-2000:]
  processor = spm.SentencePieceProcessor(model_proto=vocab.model_proto)
  sources = [ids + [EOS_ID] for ids in processor.encode(SOURCES[:4])]
  encoded = lambda texts: [[processor.encode(t)] for t in texts]
  search_reference.lines_apart(
      model, sources, encoded(lines), encoded(one_by_one.stdout.splitlines()),
      max_length_offset=10, prefixes=processor.encode(prefixes))
  plain = run_script("translate.py", f"--model={trained_export}",
                     f"--input={source}").stdout.splitlines()
  search_reference.lines_apart(model, sources[1:2], encoded(lines[1:2]),
                               encoded(plain[1:2]), max_length_offset=10)
  prefix_file.write_text("sieben\n", encoding="utf-8")
  result = run_script("translate.py", f"--model={trained_export}",
                      f"--input={source}", f"--target_prefix={prefix_file}")
  assert result.returncode == 2
  assert (f"--target_prefix={prefix_file} has 1 lines but {source} has 4"
          in result.stderr)
