from harness.core.compare import first_difference


def test_equal_answers_have_no_difference():
    assert first_difference({"a": [1, 2]}, {"a": [1, 2]}) is None


def test_first_differing_path():
    a = {"block_ids": [[1, 2, 3]], "hit_tokens": 4}
    b = {"block_ids": [[1, 2, 4]], "hit_tokens": 4}
    assert first_difference(a, b) == "block_ids[0][2]"
    assert first_difference({"x": 1}, {"y": 1}) == "x"
    assert first_difference({"free_queue": [1, 2]}, {"free_queue": [1]}) == "free_queue[1]"
    assert first_difference({"refused": True}, {"block_ids": [[]]}) == "refused"
    assert first_difference(1, 2) == ""
