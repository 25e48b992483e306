"""Word counting: split text into words and tally them."""

from collections import Counter


def words(text: str) -> list[str]:
    """Return the words of ``text`` in order."""
    return text.split()


def count_words(text: str) -> dict[str, int]:
    """Return a mapping from each word to the number of times it occurs."""
    return dict(Counter(words(text)))


def top_words(text: str, n: int) -> list[tuple[str, int]]:
    """Return the ``n`` most frequent words as (word, count) pairs.

    Higher counts come first; words with the same count are in alphabetical order.
    """
    counts = count_words(text)
    ranked = sorted(counts.items(), key=lambda item: (-item[1], item[0]))
    return ranked[:n]
