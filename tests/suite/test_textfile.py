"""Reading TOML and JSON inputs (`suite.textfile`): every problem is the caller's error naming the file."""

import pytest

from suite.errors import ClusterError, ProfileError
from suite.textfile import as_float, load_json, load_toml


def test_text_nested_too_deeply_for_the_parser_is_the_callers_error(tmp_path):
    toml = tmp_path / "deep.toml"
    toml.write_text("x = " + "[" * 100000 + "]" * 100000 + "\n")
    with pytest.raises(ClusterError, match=r"deep.toml: not valid TOML: maximum recursion depth"):  # no RecursionError
        load_toml(toml, ClusterError, "cluster")
    js = tmp_path / "deep.json"
    js.write_text("[" * 100000 + "]" * 100000)
    with pytest.raises(ProfileError, match=r"deep.json: not valid JSON: maximum recursion depth"):
        load_json(js, ProfileError, "profile")


def test_as_float():
    assert as_float(10**400) == float("inf") and as_float(-(10**400)) == float("-inf")  # too large for a float
    assert as_float(3) == 3.0 and type(as_float(3)) is float
    for not_a_number in (True, "1", None, [1]):
        assert as_float(not_a_number) != as_float(not_a_number)  # NaN
