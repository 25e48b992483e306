from intervals import merge


def test_intervals_sharing_an_endpoint_merge():
    assert merge([(1, 3), (3, 5), (8, 9)]) == [(1, 5), (8, 9)]
