"""The filter language of PROTOCOL §8: parser faults with positions, canonical round
trips and matching, with hypothesis property tests."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from herald.protocol.errors import BadRequest, ValidationError
from herald.protocol.filter import (
    MAX_FILTER_CHARS,
    FilterSyntaxError,
    HeaderEquals,
    HeaderPrefix,
    HeaderPresent,
    KeyEquals,
    KeyPrefix,
    Node,
    and_,
    check_filter,
    compile_filter,
    not_,
    or_,
    parse,
    to_text,
)
from storage.record import Record


def record(key: str | None = None, **headers: str) -> Record:
    return Record(0, 0, 0, b"1", key=key, headers=headers)


def matches(text: str, r: Record) -> bool:
    return compile_filter(parse(text))(r)


@pytest.mark.parametrize(
    ("text", "position"),
    [
        ("", 0),
        ("   ", 3),
        ("key", 3),
        ('key = "a', 6),
        ('key == "a"', 5),
        ('key = "a" and key = "b"', 10),
        ('(key = "a"', 0),
        ('key = "a")', 9),
        ('hasPrefix(key "a")', 14),
        ('headers.a b = "x"', 10),
        ('key = "a\\n"', 8),
        ("headers:", 8),
        ("NOT", 3),
        ('key = "a" AND', 13),
        ('value = "a"', 0),
        ('key = "a" # x', 10),
    ],
)
def test_malformed_filters_say_where(text: str, position: int) -> None:
    with pytest.raises(FilterSyntaxError) as fault:
        parse(text)
    assert fault.value.position == position, str(fault.value)
    assert isinstance(fault.value, BadRequest) and f"position {position}" in str(fault.value)


def test_precedence_not_then_and_then_or() -> None:
    tree = parse("headers:a OR NOT headers:b AND headers:c")
    assert tree == or_(HeaderPresent("a"), and_(not_(HeaderPresent("b")), HeaderPresent("c")))
    assert parse('key != "v"') == not_(KeyEquals("v")), "!= is exactly NOT ="
    assert parse('headers.a.b = "x"') == HeaderEquals("a.b", "x")
    assert parse('NOT NOT (key = "\\"q\\\\")') == KeyEquals('"q\\')


def test_matching_follows_the_protocol() -> None:
    assert matches('key = "k"', record("k")) and not matches('key = "k"', record(None))
    assert matches('key != "k"', record(None)), "!= is true for a null key"
    assert not matches('hasPrefix(key, "")', record(None)), "never a null key"
    assert matches('hasPrefix(key, "or")', record("orders"))
    assert matches('headers.h != "v"', record()), "!= is true for an absent header"
    assert matches("headers:h", record(h="")) and not matches("headers:h", record())
    assert matches('hasPrefix(headers.t, "eu-") AND NOT key = "x"', record("y", t="eu-1"))
    assert matches('(key = "a" OR key = "b") AND headers:z', record("b", z="1"))
    assert not matches('key = "a" OR key = "b" AND headers:z', record("b"))


def test_deep_nesting_is_no_recursion_error() -> None:
    text = "(" * 500 + "headers:a" + ")" * 500
    assert parse(text) == HeaderPresent("a")
    nots = "NOT " * 250 + "headers:a"
    assert parse(nots) == HeaderPresent("a")
    with pytest.raises(ValidationError):
        check_filter("(" * 600 + "headers:a" + ")" * 600)  # well-formed, over 1024
    with pytest.raises(FilterSyntaxError):
        check_filter("(" * 2000)  # malformed first: bad_request whatever the length


names = st.from_regex(r"[A-Za-z0-9_.-]{1,8}", fullmatch=True)
values = st.text(max_size=8)
conditions = st.one_of(
    st.builds(KeyEquals, values),
    st.builds(KeyPrefix, values),
    st.builds(HeaderEquals, names, values),
    st.builds(HeaderPrefix, names, values),
    st.builds(HeaderPresent, names),
)
trees: st.SearchStrategy[Node] = st.recursive(
    conditions,
    lambda inner: st.one_of(
        st.builds(not_, inner),
        st.builds(and_, inner, inner),
        st.builds(or_, inner, inner),
    ),
    max_leaves=12,
)


@settings(max_examples=300, deadline=None)
@given(trees)
def test_round_trip_through_the_canonical_text(tree: Node) -> None:
    assert parse(to_text(tree)) == tree


@settings(max_examples=500, deadline=None)
@given(st.text(alphabet=st.sampled_from(list('keyheadrsPfixNOTAND ()",=!:\\.ab')), max_size=40))
def test_any_string_parses_or_is_a_bad_request(text: str) -> None:
    try:
        check_filter(text)
    except (FilterSyntaxError, ValidationError) as fault:
        assert fault.status == 400
        if isinstance(fault, FilterSyntaxError):
            assert 0 <= fault.position <= len(text)


@settings(max_examples=300, deadline=None)
@given(st.text(max_size=60))
def test_any_unicode_string_parses_or_is_a_bad_request(text: str) -> None:
    try:
        compile_filter(parse(text))
    except FilterSyntaxError as fault:
        assert 0 <= fault.position <= len(text)


def evaluate(tree: Node, r: Record) -> bool:
    """A plain reference evaluator, to check the compiled matcher against."""
    from herald.protocol.filter import And, Not, Or

    if isinstance(tree, KeyEquals):
        return r.key is not None and r.key == tree.value
    if isinstance(tree, KeyPrefix):
        return r.key is not None and r.key.startswith(tree.prefix)
    if isinstance(tree, HeaderEquals):
        return tree.name in r.headers and r.headers[tree.name] == tree.value
    if isinstance(tree, HeaderPrefix):
        return tree.name in r.headers and r.headers[tree.name].startswith(tree.prefix)
    if isinstance(tree, HeaderPresent):
        return tree.name in r.headers
    if isinstance(tree, Not):
        return not evaluate(tree.operand, r)
    if isinstance(tree, And):
        return all(evaluate(t, r) for t in tree.operands)
    assert isinstance(tree, Or)
    return any(evaluate(t, r) for t in tree.operands)


@settings(max_examples=300, deadline=None)
@given(
    trees,
    st.one_of(st.none(), values),
    st.dictionaries(names, values, max_size=4),
)
def test_compiled_matcher_agrees_with_the_tree(
    tree: Node, key: str | None, headers: dict[str, str]
) -> None:
    r = Record(0, 0, 0, b"1", key=key, headers=headers)
    assert compile_filter(tree)(r) == evaluate(tree, r)


def test_the_length_limit_is_1024() -> None:
    text = 'key = "' + "x" * (MAX_FILTER_CHARS - 8) + '"'
    assert len(text) == MAX_FILTER_CHARS and check_filter(text) == text
    with pytest.raises(ValidationError):
        check_filter(text + " ")
