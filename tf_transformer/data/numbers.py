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


def _draw_numbers(count: int, seed: int) -> List[int]:
  """`count` distinct numbers, as many with each digit count 1..6 as exist
  (so small numbers are not drowned by the 900,000 six-digit ones)."""
  rng = random.Random(seed)
  capacity = 10**MAX_DIGITS
  if count > capacity:
    raise DataError(f"numbers: {count} pairs asked for, at most {capacity} "
                    "distinct numbers exist")
  chosen, seen = [], set()
  while len(chosen) < count:
    digits = rng.randint(1, MAX_DIGITS)
    low = 0 if digits == 1 else 10**(digits - 1)
    number = rng.randrange(low, 10**digits)
    if number not in seen:
      seen.add(number)
      chosen.append(number)
  return chosen


def generate(sizes: Dict[str, int] = None, seed: int = 0,
             source_language: str = "en",
             target_language: str = "de") -> Dict[str, List[tuple]]:
  """{split: [(source words, target words), ...]} with disjoint numbers."""
  sizes = dict(DEFAULT_SIZES if sizes is None else sizes)
  numbers = _draw_numbers(sum(sizes.values()), seed)
  splits, start = {}, 0
  # Test and dev first, so the train size can change without moving them.
  for split in sorted(sizes, key=lambda s: (s == "train", s)):
    chunk = numbers[start:start + sizes[split]]
    start += sizes[split]
    try:
      splits[split] = [(num2words(n, lang=source_language),
                        num2words(n, lang=target_language)) for n in chunk]
    except NotImplementedError:
      raise DataError(f"numbers: num2words has no language "
                      f"{source_language!r} or {target_language!r}") from None
  return splits
