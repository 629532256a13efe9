from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from agentgym_opsd.parsers import MAX_ACTION_CHARS, TagParser, WebShopParser, make_parser


def test_tag_parser_basic():
    p = TagParser()
    r = p.parse("<think>go</think><action> go to  desk 1 </action>")
    assert r.valid and r.action == "go to desk 1" and r.kind == "action"
    assert not p.parse("go to desk 1").valid
    assert not p.parse("<action>   </action>").valid
    assert p.parse(p.format("open fridge 1")).action == "open fridge 1"


def test_search_answer_follows_search_r1():
    p = make_parser("tag:search,answer")
    assert p.parse("<search>who wrote x</search>").action == "<search>who wrote x</search>"
    assert p.parse("<answer>Paris</answer>").kind == "answer"
    # the first complete tag is the action; what follows is ignored (search-then-answer searches)
    assert p.parse("<search>a</search><answer>b</answer>").action == "<search>a</search>"
    # the match runs from the first opening tag to its first closing tag, as Search-R1's regex does
    assert p.parse("<think>hm <answer>x</think><answer>b</answer>").action == "<answer>x</think><answer>b</answer>"
    assert p.parse("<search>a <answer>b</answer> c</search>").action == "<search>a <answer>b</answer> c</search>"
    # empty tags are actions (an empty query is searched, an empty answer scored), tag names are exact
    assert p.parse("<search></search>").action == "<search></search>"
    assert p.parse("<answer>  </answer>").valid
    assert not p.parse("<SEARCH>a</SEARCH>").valid
    assert not p.parse("no tags at all").valid
    assert not p.parse("<search>unclosed").valid
    assert p.format("<answer>x</answer>") == "<answer>x</answer>"


def test_strict_search_answer_is_verl_agents_projection():
    p = make_parser("tag-strict:search,answer")
    both = p.parse("<search>a</search><answer>b</answer>")
    assert not both.valid and "more than one" in both.reason
    assert p.parse("<answer>b</answer>").valid


def test_tag_parser_long_and_control_chars():
    p = TagParser()
    assert not p.parse("<action>" + "a" * (MAX_ACTION_CHARS + 1) + "</action>").valid
    assert p.parse("<action>go\x00 to\x07 desk</action>").action == "go to desk"


def test_webshop_parser():
    p = WebShopParser()
    assert p.parse("search[red shirt]").action == "search[red shirt]"
    assert p.parse("I think <action>click[Buy Now]</action>").action == "click[buy now]"
    assert p.parse("<action>Click[B0ABC]</action> search[x]").action == "click[b0abc]"
    assert not p.parse("click[]").valid
    assert not p.parse("buy it").valid
    assert p.parse(p.format("click[next >]")).action == "click[next >]"


def test_make_parser_unknown():
    import pytest

    with pytest.raises(ValueError, match="unknown parser spec"):
        make_parser("xml")


@settings(max_examples=300, deadline=None)
@given(st.text(max_size=300))
def test_parsers_never_raise_and_never_emit_invalid_actions(text):
    for parser in (TagParser(), make_parser("tag:search,answer"), WebShopParser()):
        r = parser.parse(text)
        assert isinstance(r.valid, bool)
        if r.valid:
            assert r.action and len(r.action) <= MAX_ACTION_CHARS + 20
        else:
            assert r.action == "" and r.reason


@settings(max_examples=100, deadline=None)
@given(st.text(alphabet=st.characters(blacklist_categories=("Cs", "Cc")), min_size=1, max_size=50).filter(
    lambda s: s.strip() and "<" not in s and ">" not in s))
def test_format_parse_roundtrip(action):
    p = TagParser()
    r = p.parse(p.format(action))
    assert r.valid and r.action == " ".join(action.split())
