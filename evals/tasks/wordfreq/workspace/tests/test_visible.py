from wordfreq import count_words


def test_case_and_punctuation_do_not_split_a_word():
    assert count_words("The cat saw the dog. The end.") == {
        "the": 3,
        "cat": 1,
        "saw": 1,
        "dog": 1,
        "end": 1,
    }
