import pytest

from harness.fuzz.actions import New, Schedule
from harness.fuzz.campaign import case_rng
from harness.fuzz.generate import FuzzConfig, draw_case


def test_cases_are_reproducible():
    a = draw_case(case_rng(7, 3), FuzzConfig(), 40)
    b = draw_case(case_rng(7, 3), FuzzConfig(), 40)
    assert a == b
    assert draw_case(case_rng(7, 4), FuzzConfig(), 40) != a


def test_cases_reach_the_corners():
    fc = FuzzConfig()
    actions = [a for i in range(300) for a in draw_case(case_rng(1, i), fc, 40)[1]]
    news = [a for a in actions if isinstance(a, New)]
    scheds = [a for a in actions if isinstance(a, Schedule)]
    assert any(a.cache_salt for a in news) and any(a.lora for a in news)
    assert any(a.delay_cache for a in scheds) and any(a.lookahead for a in scheds)
    assert any(a.external for a in scheds) and any(a.full_sequence_must_fit for a in scheds)
    lengths = {len(a.prompt) for a in news}
    assert {1, 2, 4, 16} <= lengths  # block multiples


def test_config_file_keys_are_checked():
    assert FuzzConfig.from_dict({"block_sizes": [8]}).block_sizes == (8,)
    assert FuzzConfig.from_dict({"weights": {"reset": 5}}).weights["new"] == 14
    with pytest.raises(ValueError, match="unknown fuzz config key"):
        FuzzConfig.from_dict({"blok_sizes": [8]})


def test_multimodal_requests_share_their_documents_items():
    from harness.fuzz.slices import load_kind_config

    fc = load_kind_config("multimodal")
    news = [a for i in range(200) for a in draw_case(case_rng(2, i), fc, 40)[1]
            if isinstance(a, New)]
    with_mm = [a for a in news if a.mm]
    assert with_mm and any(a.embeds_seed is not None for a in news)
    for a in with_mm:  # sorted, disjoint, inside the prompt
        ends = [0]
        for _, offset, length in a.mm:
            assert offset >= ends[-1] and length >= 1
            ends.append(offset + length)
        assert ends[-1] <= len(a.prompt)
    # Requests sharing a first item (a document's layout: hits where they meet).
    assert any(x is not y and x.mm[0] == y.mm[0] for x in with_mm for y in with_mm)
    # Other configs draw none.
    plain = [a for i in range(50) for a in draw_case(case_rng(2, i), FuzzConfig(), 40)[1]
             if isinstance(a, New)]
    assert not any(a.mm or a.embeds_seed is not None for a in plain)
