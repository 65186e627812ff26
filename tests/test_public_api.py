"""The public API of `import suite`: every exported name is there, documented, and shown by `help(suite)`."""

from __future__ import annotations

import subprocess
import sys

import pytest

import suite
from suite.errors import UnknownNameError


def test_dir_and_help_show_every_exported_name():
    """The classes and functions are imported when first used; `dir(suite)` and so `help(suite)` listed only
    those already imported (in a fresh process: load_cluster, load_workload and PlacebenchError)."""
    code = ("import pydoc, suite; print(sorted(set(suite.__all__) - set(dir(suite))));"
            "print(pydoc.render_doc(suite, renderer=pydoc.plaintext))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    missing, text = out.split("\n", 1)
    assert missing == "[]"
    for name in suite.__all__:
        value = getattr(suite, name)
        assert (f"class {name}(" if isinstance(value, type) else f"\n    {name}(") in text, name


def test_every_exported_name_has_its_own_docstring():
    """A dataclass without a docstring gets its signature as one, which says nothing of what it is."""
    for name in suite.__all__:
        value = getattr(suite, name)
        doc = value.__doc__ or ""
        assert doc.strip() and not doc.startswith(f"{name}("), name


@pytest.mark.parametrize("load, listed", [(suite.load_workload, "zoo workloads: "),
                                          (suite.load_cluster, "presets: ")])
def test_an_unknown_name_lists_the_known_ones(load, listed):
    """As the docstrings say."""
    with pytest.raises(UnknownNameError) as info:
        load("no_such_name")
    assert listed in str(info.value) and "UnknownNameError" in load.__doc__
