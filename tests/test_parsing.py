"""Response parsing, the format reward and the repetition penalty (spec sections 1.1 and 3)."""

import pytest
from hypothesis import given, settings, strategies as st

from rlpr.reward.parsing import format_reward, has_repetition, parse_response

pytestmark = pytest.mark.unit

TAGS = ["<think>", "</think>", "<answer>", "</answer>", "\\boxed{"]

R1_CASES = [
    ("<think> a </think> <answer> Paris </answer>", True, "<think> a </think> <answer>", " "),
    ("<think>a</think><answer>Paris</answer>", True, "<think>a</think><answer>", " "),
    ("<think> a </think>\n<answer>\n\tParis\n</answer>", True, "<think> a </think>\n<answer>", "\n\t"),
    ("<think> a </think> <answer> </answer>", True, "<think> a </think> <answer>", " "),
    ("<think> a </think> <answer>", True, "<think> a </think> <answer>", " "),  # cut right after
    ("<think> a </think> <answer>\r\n x", True, "<think> a </think> <answer>", "\r\n "),
    ("preamble <think> a </think> <answer> x", True, "preamble <think> a </think> <answer>", " "),
    ("<think> a </think> b", False, None, None),
    ("<answer> x </answer>", False, None, None),
    ("<think> a <think> b </think> <answer> x", False, None, None),
    ("<think> a </think> <answer> x <answer> y", False, None, None),
    ("</think> <think> <answer> x", False, None, None),
    ("<answer> x </answer> <think> a </think>", False, None, None),
    ("", False, None, None),
]


@pytest.mark.parametrize("response,valid,head,gap", R1_CASES)
def test_r1_parsing(response, valid, head, gap):
    parsed = parse_response(response, "r1")
    assert parsed.valid is valid
    if valid:
        assert parsed.head == head and parsed.gap == gap and parsed.tail == " </answer>"


@pytest.mark.parametrize("response,valid", [
    ("Step by step... <answer> 4 </answer>", True),
    ("<answer>4", True),
    ("no tags", False),
    ("<answer> 4 </answer> <answer> 5 </answer>", False),
    ("<think> x </think> <answer> 4", True),
])
def test_r1_nothink_parsing(response, valid):
    assert parse_response(response, "r1_nothink").valid is valid


def test_boxed_uses_last_box():
    parsed = parse_response(r"first \boxed{1} then \boxed{2}", "boxed")
    assert parsed.valid and parsed.head == r"first \boxed{1} then \boxed{" and parsed.tail == "}"
    assert not parse_response("no box", "boxed").valid


def test_unknown_mode():
    with pytest.raises(ValueError, match="unknown format mode"):
        parse_response("x", "xml")


@pytest.mark.parametrize("response,expected", [
    ("<think> a </think> <answer> b </answer>", 1.0),
    ("  \n<think> a </think> <answer> b </answer> trailing", 1.0),
    ("<think> a </think> <answer> b", 0.0),  # parse-valid but not format-valid
    ("x <think> a </think> <answer> b </answer>", 0.0),  # must start with <think>
    ("<think> a </think> <answer> b </answer> </answer>", 0.0),
    ("<answer> b </answer> <think> a </think>", 0.0),
    ("plain text", 0.0),
])
def test_format_reward_r1(response, expected):
    assert format_reward(response, "r1") == expected


@pytest.mark.parametrize("response,expected", [
    ("reasoning <answer> b </answer>", 1.0),
    ("<answer> b", 0.0),
    ("<answer> b </answer><answer> c </answer>", 0.0),
])
def test_format_reward_nothink(response, expected):
    assert format_reward(response, "r1_nothink") == expected


def test_repetition_threshold():
    window = " ".join(f"w{i}" for i in range(10))
    assert has_repetition(" ".join([window] * 10))
    assert not has_repetition(" ".join([window] * 9))
    assert has_repetition(" ".join(["same"] * 19))  # overlapping windows count
    assert not has_repetition(" ".join(["same"] * 18))
    assert not has_repetition("short text")


@settings(max_examples=300, deadline=None)
@given(st.lists(st.sampled_from(list("ab <>/\n\t\\{}") + TAGS), max_size=40).map("".join)
       | st.text(max_size=200))
def test_parsing_never_raises(response):
    for mode in ("r1", "r1_nothink", "boxed"):
        parsed = parse_response(response, mode)
        if parsed.valid:
            assert response.startswith(parsed.head)
        assert format_reward(response, mode) in (0.0, 1.0)
    has_repetition(response)
