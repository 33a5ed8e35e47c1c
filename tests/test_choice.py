"""The main job's choice of the model to export (run/choice.py) and the
paired tests it rests on (evaluation.paired_p_value): section 6.1's average
of the last checkpoints, replaced only by a lead on dev beyond chance."""

import math

import pytest

from tf_transformer import evaluation
from tf_transformer.run import choice

# 200 dev sentences of 6-9 distinct words each.
REFERENCES = [" ".join(f"w{i}x{j}" for j in range(6 + i % 4))
              for i in range(200)]


def _dropping_last_word(count):
  """The references with the last word of the first `count` dropped."""
  return [r.rsplit(" ", 1)[0] if i < count else r
          for i, r in enumerate(REFERENCES)]


def test_mcnemar_exact_test_in_closed_form():
  right, wrong = "a", "b"
  references = [right] * 20

  def p(only_baseline, only_system):
    baseline = ([right] * only_baseline + [wrong] * only_system
                + [right] * (20 - only_baseline - only_system))
    system = ([wrong] * only_baseline + [right] * only_system
              + [right] * (20 - only_baseline - only_system))
    return evaluation.paired_p_value("exact_match", baseline, system,
                                     references)
  # Two-sided binomial tail over the discordant sentences, at a half.
  assert p(0, 10) == pytest.approx(2 / 2 ** 10)
  assert p(1, 9) == pytest.approx(2 * (1 + 10) / 2 ** 10)
  assert p(9, 1) == p(1, 9)
  assert p(3, 3) == 1.0
  # Sentences both get right or both wrong do not count.
  assert evaluation.paired_p_value(
      "exact_match", [wrong] * 5 + [right] * 5, [wrong] * 5 + [wrong] * 5,
      [right] * 10) == pytest.approx(2 / 2 ** 5)


def test_paired_bootstrap_separates_a_clear_lead_from_one_sentence():
  whole, clipped = REFERENCES, _dropping_last_word(100)
  clear = evaluation.paired_p_value("bleu", clipped, whole, REFERENCES)
  one = evaluation.paired_p_value("bleu", _dropping_last_word(1),
                                  whole, REFERENCES)
  # One sentence a word short: a lead that resampling often repeats (about
  # one draw in twelve has it three times or more), not significant.
  assert clear < 0.01 and one > choice.SIGNIFICANCE
  # sacrebleu's fixed seed: the same translations give the same p.
  assert evaluation.paired_p_value("bleu", clipped, whole,
                                   REFERENCES) == clear
  # Identical translations are no evidence either way.
  assert evaluation.paired_p_value("bleu", whole, list(whole),
                                   REFERENCES) == 1.0


def test_paired_tests_name_what_they_cannot_compare():
  with pytest.raises(ValueError, match="2 and 1 translations for 2"):
    evaluation.paired_p_value("bleu", ["a", "b"], ["a"], ["a", "b"])
  with pytest.raises(ValueError, match="'loss': a paired test is for"):
    evaluation.paired_p_value("loss", ["a"], ["a"], ["a"])


def _candidate(name, hypotheses, loss):
  scores = evaluation.score(hypotheses, REFERENCES)
  return choice.Candidate(name, {"model_dir": name}, dict(
      bleu=scores["bleu"], exact_match=scores["exact_match"], loss=loss,
      hypotheses=hypotheses, references=REFERENCES))


def test_the_average_stays_unless_another_leads_beyond_chance():
  average = _candidate("average", _dropping_last_word(40), 2.0)
  close = _candidate("best", _dropping_last_word(39), 2.1)
  clear = _candidate("best", REFERENCES, 2.1)
  # One sentence better: within chance, the average is kept.
  assert close.dev["bleu"] > average.dev["bleu"]
  chosen, why = choice.choose([average, close], "bleu")
  assert chosen is average
  assert why.startswith("section 6.1's average: a lead of +0.")
  assert " dev BLEU is within chance (paired bootstrap, p = " in why
  assert float(why.rsplit("p = ", 1)[1].rstrip(")")) >= choice.SIGNIFICANCE
  # Forty sentences better: beyond chance, the leader is exported.
  chosen, why = choice.choose([average, close, clear], "bleu")
  assert chosen is clear
  lead = clear.dev["bleu"] - average.dev["bleu"]
  assert why.startswith(f"the highest dev BLEU, {lead:+.4g} over the "
                        "average, beyond chance (paired bootstrap, p = ")
  # The average leading, or level, needs no test.
  assert choice.choose([clear, average], "bleu") == (clear,
                                                     "the highest dev BLEU")
  assert choice.choose([average, _candidate("same", average.dev[
      "hypotheses"], 1.0)], "bleu")[0] is average


def test_exact_match_uses_mcnemar_and_loss_takes_the_lowest():
  average = _candidate("average", _dropping_last_word(12), 2.0)
  best = _candidate("best", _dropping_last_word(2), 1.9)
  chosen, why = choice.choose([average, best], "exact_match")
  # 10 sentences right only for the best, none only for the average.
  p = 2 / 2 ** 10
  assert chosen is best
  assert why == ("the highest dev exact match, +0.05 over the average, "
                 f"beyond chance (McNemar's exact test, p = {p:.2g})")
  assert math.isclose(p, evaluation.paired_p_value(
      "exact_match", average.dev["hypotheses"], best.dev["hypotheses"],
      REFERENCES))
  # By loss, no translation is compared: the lowest loss is taken.
  assert choice.choose([average, best], "loss") == (best,
                                                    "the lowest dev loss")
  assert choice.choose([best, average], "loss") == (best,
                                                    "the lowest dev loss")
