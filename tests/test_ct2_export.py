"""The CTranslate2 export: the same weights give the same outputs, scores and
per-token log-probabilities as our own graph, and the bin/ scripts take
either export."""

import numpy as np
import pytest
import sentencepiece as spm
import tensorflow as tf

from tf_transformer import build_model
from tf_transformer import get_config
from tf_transformer.data import numbers
from tf_transformer.decoding.ct2_runtime import CT2Decoder
from tf_transformer.decoding.scoring import Scorer
from tf_transformer.decoding.search import DecodingOptions
from tf_transformer.serving import ct2_export
from tf_transformer.decoding.translation_module import TranslationModule
from tf_transformer.run import run_dir
from conftest import run_script
from training_helpers import token_log_probs, vocabulary

SOURCES, REFERENCES = zip(*numbers.generate({"test": 200}, seed=7)["test"])


@pytest.fixture(name="trained")
def _trained(trained_numbers_run):
  return trained_numbers_run


def _both(model_dir, tmp_path, options):
  """(our nbest function, the CTranslate2 decoder) for one checkpoint."""
  model, vocab = run_dir.load_trained_model(str(model_dir))
  module = TranslationModule(model, vocab, options)
  path = ct2_export.export(model, vocab, str(tmp_path / "ct2"), options)

  def ours(texts):
    out = module.nbest(tf.constant(texts))
    return out["translations"].numpy(), out["scores"].numpy()
  return ours, CT2Decoder(path)


def _compare(ours, ct2, texts, batch_size=32):
  """(the share of texts whose best translation is the same, the largest
  score gap among those, and the text that gave it)."""
  same, worst = 0, (0.0, None)
  for start in range(0, len(texts), batch_size):
    batch = list(texts[start:start + batch_size])
    our_texts, our_scores = ours(batch)
    ct2_texts, ct2_scores = ct2.nbest(batch)
    for text, a, b, sa, sb in zip(batch, our_texts, ct2_texts, our_scores,
                                  ct2_scores):
      if a[0] == b[0]:
        same += 1
        worst = max(worst, (abs(sa[0] - sb[0]), text))
  return same / len(texts), worst


@pytest.mark.parametrize("method", ["beam", "greedy"])
def test_outputs_and_scores_equal_ours(trained, tmp_path, method):
  """Both engines search the same space, so a shared best translation has
  the same score. The two agree per token within about 1e-6 (float32 at
  d_model 64), these sentences have at most about 20 tokens and the score is
  divided by a length penalty >= 1: 1e-4 leaves a margin of 5 over what
  float32 accumulation can add up to. A difference in the search itself
  shows above it: CTranslate2's default ban on EOS at the first step
  renormalized that step and raised scores by 8e-4 to 3.6e-3, by host."""
  ours, ct2 = _both(trained, tmp_path, DecodingOptions(method=method))
  agreement, (score_gap, text) = _compare(ours, ct2, SOURCES)
  assert agreement >= 0.99
  assert score_gap < 1e-4, f"score gap {score_gap:.2e} on {text!r}"


def _max_token_gap(model, vocab, tmp_path, sources, targets):
  path = ct2_export.export(model, vocab, str(tmp_path / "ct2"),
                           DecodingOptions())
  theirs = CT2Decoder(path).token_log_probs(sources, targets)
  processor = spm.SentencePieceProcessor(model_proto=vocab.model_proto)
  ours = token_log_probs(model, processor, sources, targets)
  assert [len(t) for t in theirs] == [len(o) for o in ours]
  return max(np.max(np.abs(np.array(t) - o)) for t, o in zip(theirs, ours))


def test_token_log_probs_equal_ours(trained, tmp_path):
  model, vocab = run_dir.load_trained_model(str(trained))
  gap = _max_token_gap(model, vocab, tmp_path, SOURCES[:64],
                       REFERENCES[:64])
  assert gap < 1e-3


@pytest.mark.parametrize("overrides", [
    "norm_position=pre",            # a final LayerNorm in each stack
    "positional_encoding=learned",  # Table 3 row E: the learned table
    "share_embeddings=False",       # three embedding matrices
    "d_k=8,d_v=8",                  # heads narrower than d_model / h
])
def test_architecture_variants_convert_exactly(tmp_path, overrides):
  config = get_config("tiny", overrides, vocab_size=vocabulary().vocab_size)
  model = build_model(config)
  gap = _max_token_gap(model, vocabulary(), tmp_path, SOURCES[:16],
                       REFERENCES[:16])
  assert gap < 1e-3


def test_refuses_keys_and_values_of_different_sizes(tmp_path):
  config = get_config("tiny", "d_k=8,d_v=16",
                      vocab_size=vocabulary().vocab_size)
  with pytest.raises(ValueError, match="d_k=8 and d_v=16"):
    ct2_export.export(build_model(config), vocabulary(),
                      str(tmp_path / "ct2"), DecodingOptions())


def test_scripts_take_either_export(trained, tmp_path):
  saved = tmp_path / "saved"
  ct2_dir = tmp_path / "ct2"
  for extra in ([f"--export_dir={saved}"],
                [f"--export_dir={ct2_dir}", "--format=ctranslate2"]):
    result = run_script("export.py", f"--model_dir={trained}", *extra)
    assert result.returncode == 0, result.stderr[-2000:]
  assert sorted(p.name for p in ct2_dir.iterdir()) == [
      "config.json", "model.bin", "shared_vocabulary.json",
      "tf_transformer.json", "vocabulary.model"]
  source = tmp_path / "source.txt"
  source.write_text("".join(s + "\n" for s in SOURCES[:40]))
  reference = tmp_path / "reference.txt"
  reference.write_text("".join(s + "\n" for s in REFERENCES[:40]))
  outputs = []
  for model in (saved / "1", ct2_dir):
    result = run_script("evaluate.py", f"--model={model}",
                        f"--source={source}", f"--reference={reference}",
                        f"--output={tmp_path / model.name}.out")
    assert result.returncode == 0, result.stderr[-2000:]
    assert result.stdout.startswith("BLEU = ")
    outputs.append((tmp_path / f"{model.name}.out").read_text().splitlines())
  assert len(outputs[1]) == 40
  assert sum(a == b for a, b in zip(*outputs)) >= 39

  neither = run_script("translate.py", f"--model={tmp_path}",
                       input_text="seven\n")
  assert neither.returncode == 1
  assert "neither a SavedModel (saved_model.pb) nor a CTranslate2" in (
      neither.stderr)


def test_scorer_gives_what_the_savedmodel_signature_gives(trained, tmp_path):
  """bin/score.py's two engines: CTranslate2's `score_batch` and the
  `score` signature's graph agree, long targets cut alike."""
  model, vocab = run_dir.load_trained_model(str(trained))
  module = TranslationModule(model, vocab, max_input_tokens=24)
  path = ct2_export.export(model, vocab, str(tmp_path / "ct2"),
                           module.options, max_input_tokens=24)
  sources = list(SOURCES[:16]) + ["seven"]
  targets = list(REFERENCES[:16]) + ["sieben " * 100]
  theirs = Scorer.from_export(path).score(sources, targets)
  ours = Scorer.from_module(module).score(sources, targets)
  assert [len(t) for _, t in theirs] == [len(t) for _, t in ours]
  assert len(ours[-1][1]) == 24 + module.options.max_decode_length_offset + 1
  for (total, values), (want, want_values) in zip(theirs, ours):
    assert total == pytest.approx(want, abs=1e-3)
    np.testing.assert_allclose(values, want_values, atol=1e-4)


def test_target_prefix_through_ctranslate2(trained, tmp_path):
  """CTranslate2's `target_prefix` forces the prefix too, but ranks and
  scores the completion alone (the prefix's own log-probability left out,
  the length penalty over the whole output: measured), where ours counts
  the whole output: an unlikely prefix can get another completion. An
  empty prefix gives both engines' plain translation."""
  model, vocab = run_dir.load_trained_model(str(trained))
  module = TranslationModule(model, vocab, max_input_tokens=24)
  path = ct2_export.export(model, vocab, str(tmp_path / "ct2"),
                           module.options, max_input_tokens=24)
  processor = spm.SentencePieceProcessor(model_proto=vocab.model_proto)
  sources = list(SOURCES[:32])
  prefixes = [processor.decode(p[:2]) for p in processor.encode(
      list(REFERENCES[1:33]), out_type=str)]
  prefixes[:4] = [""] * 4
  ours = module.translate_with_prefix(tf.constant(sources),
                                      tf.constant(prefixes))
  decoder = CT2Decoder(path)
  theirs = decoder.translate_with_prefix(sources, prefixes)
  assert all(t.decode().startswith(p) for t, p in zip(theirs[0], prefixes))
  same = [a == b for a, b in zip(ours["translation"].numpy(), theirs[0])]
  assert np.mean(same) >= 0.8  # 29 of 32 measured
  plain = decoder.nbest(sources[:4])
  assert [row[0] for row in plain[0]] == list(theirs[0][:4])
  np.testing.assert_allclose(ours["score"][:4], theirs[1][:4], atol=1e-4)
