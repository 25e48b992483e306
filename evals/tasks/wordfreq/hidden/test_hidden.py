from wordfreq import count_words, top_words


def test_mixed_case_and_trailing_punctuation():
    assert count_words("Hello, hello! HELLO?") == {"hello": 3}


def test_casefold_not_just_lower():
    assert count_words("Straße STRASSE strasse") == {"strasse": 3}


def test_inner_apostrophe_is_kept():
    assert count_words("Don't stop; don't.") == {"don't": 2, "stop": 1}


def test_quotes_and_brackets_are_stripped():
    assert count_words('"quoted" (word) [word]') == {"quoted": 1, "word": 2}


def test_pure_punctuation_is_not_a_word():
    assert count_words("wait -- what ... !!") == {"wait": 1, "what": 1}


def test_empty_and_blank_text():
    assert count_words("") == {}
    assert count_words("  \n\t ") == {}


def test_top_words_ties_are_alphabetical_after_folding():
    text = "b B a, A. c"
    assert top_words(text, 2) == [("a", 2), ("b", 2)]
