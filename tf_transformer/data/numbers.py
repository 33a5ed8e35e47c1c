"""`numbers`: the embedded task, English number words to German number words.

    "four hundred and twenty-one" -> "vierhunderteinundzwanzig"

German writes units before tens ("ein-und-zwanzig"), so the model must learn
to reorder, and it glues a whole number below a million into one word, so the
shared subword vocabulary matters. Generated with `num2words`, deterministic
for a seed; train, dev and test hold disjoint numbers. Other target languages
that num2words supports can be chosen (`target_language`).
"""

import random
from typing import Dict, List

from num2words import num2words

from tf_transformer.data.errors import DataError

DEFAULT_SIZES = {"train": 40000, "dev": 500, "test": 500}
MAX_DIGITS = 6  # numbers below one million
LEXICON = 100  # zero to ninety-nine: the words every other number is built of
# The share of a train split the lexicon fills, each number repeated alike:
# once each, 100 of 40,000 pairs, a model learns that every number has a
# hundred or a thousand in it ("seven" -> "siebenhundertsieben").
LEXICON_SHARE = 0.05


def _draw_numbers(count: int, rng: random.Random, seen: set) -> List[int]:
  """`count` distinct numbers from LEXICON up, not in `seen`, as many with
  each digit count 3..6 as remain (so hundreds are not drowned by the
  900,000 six-digit numbers)."""
  digit_counts = list(range(len(str(LEXICON)), MAX_DIGITS + 1))
  capacity = 10**MAX_DIGITS - LEXICON - len(seen - set(range(LEXICON)))
  if count > capacity:
    raise DataError(f"numbers: {count + len(seen)} distinct numbers asked "
                    f"for (the lexicon's repeats aside), at most "
                    f"{10**MAX_DIGITS} exist")
  chosen = []
  while len(chosen) < count:
    digits = rng.choice(digit_counts)
    number = rng.randrange(10**(digits - 1), 10**digits)
    if number not in seen:
      seen.add(number)
      chosen.append(number)
  return chosen


def _lexicon(size: int, rng: random.Random) -> List[int]:
  """The lexicon's numbers for a train split of `size` pairs: each once
  (as many as fit), then all of them repeated until they fill about
  LEXICON_SHARE of it, as a dictionary drilled beside the text."""
  lexicon = list(range(LEXICON))
  rng.shuffle(lexicon)
  repeats = max(1, round(size * LEXICON_SHARE / LEXICON))
  return (lexicon * repeats)[:size]


def generate(sizes: Dict[str, int] = None, seed: int = 0,
             source_language: str = "en",
             target_language: str = "de") -> Dict[str, List[tuple]]:
  """{split: [(source words, target words), ...]} with disjoint numbers.

  The numbers below 100 are the task's lexicon (section 5.1's vocabulary of
  this language pair): all of them go to train, in front, as a dictionary
  would, repeated to fill LEXICON_SHARE of it; dev and test hold numbers
  from 100 up that train never sees, so they measure how the model
  composes, not what it memorised."""
  sizes = dict(DEFAULT_SIZES if sizes is None else sizes)
  rng = random.Random(seed)
  seen = set(range(LEXICON))
  splits = {}
  # Test and dev first, so the train size can change without moving them.
  for split in sorted(sizes, key=lambda s: (s == "train", s)):
    if split == "train":
      chunk = _lexicon(sizes[split], rng)
      chunk += _draw_numbers(sizes[split] - len(chunk), rng, seen)
    else:
      chunk = _draw_numbers(sizes[split], rng, seen)
    try:
      splits[split] = [(num2words(n, lang=source_language),
                        num2words(n, lang=target_language)) for n in chunk]
    except NotImplementedError:
      raise DataError(f"numbers: num2words has no language "
                      f"{source_language!r} or {target_language!r}") from None
  return splits
