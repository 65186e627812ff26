"""The family table of the built-in placers (suite/placers.toml): complete, and read with clear errors."""

from __future__ import annotations

import pytest

from suite import placer
from suite.errors import PlacebenchError


def test_every_placer_of_this_repository_has_exactly_one_family():
    """The in-tree entry points (a user's installed plugin package may add others: they need no family)."""
    in_tree = {name for name, ep in placer._entry_points().items() if ep.value.startswith(("baselines.", "rl."))}
    families = placer.placer_families()
    assert set(families) == in_tree and len(in_tree) == 15
    assert list(families)[:2] == ["single_cpu", "single_gpu"] and list(families)[-1] == "hsdag"


def test_placer_order_puts_unlisted_names_last_by_name_and_drops_repeats():
    assert placer.placer_order(["zz", "post", "single_cpu", "aa", "post", "scotch"]) == [
        "single_cpu", "scotch", "post", "aa", "zz"]


@pytest.mark.parametrize(("text", "message"), [
    ('[[family]]\nname = "a"\nplacers = ["x"]\n[[family]]\nname = "b"\nplacers = ["x"]\n', "'x' is listed twice"),
    ('[[family]]\nplacers = ["x"]\n', "needs a name and a list of placer names"),
    ('[family]\nname = "a"\nplacers = ["x"]\n', "must be an array of tables"),
    ('[[family]]\nname = "a"\nplacers = [1, "x"]\n', "needs a name and a list of placer names"),
    ('family = ["a"]\n', "needs a name and a list of placer names"),
    ('[[family]\n', "not valid TOML"),
])
def test_a_bad_family_file_is_an_error_naming_it(tmp_path, monkeypatch, text, message):
    path = tmp_path / "placers.toml"
    path.write_text(text)
    monkeypatch.setattr(placer, "FAMILIES_FILE", path)
    placer.placer_families.cache_clear()
    try:
        with pytest.raises(PlacebenchError, match=message) as err:
            placer.placer_families()
        assert str(path) in str(err.value)
    finally:
        placer.placer_families.cache_clear()
