"""`check_json_finite`: the walk that skips containers of leaves finds every NaN/infinity, wherever it sits."""

from __future__ import annotations

import math
import re
from collections import OrderedDict
from typing import Any

import pytest

from agentlightning._models import check_json_finite


class _Float(float):
    pass


class _List(list[Any]):
    pass


# NaN/inf at each place the walk takes a different branch: behind leaf-only siblings (the C-level skip), in a token
# entry (str, float, list of ints), in subclasses of float, list and dict, in a tuple, at the top.
BAD: list[tuple[Any, str]] = [
    (math.nan, "v"),
    ([1, 2, "x", None, True, math.inf], "v[5]"),
    ({"content": [{"token": "a", "logprob": -0.5, "bytes": [97]}, {"token": "b", "logprob": -math.inf}]},
     "v['content'][1]['logprob']"),
    ((1, (2, ("s", -math.inf))), "v[1][1][1]"),
    ([_Float("nan")], "v[0]"),
    (_List([1, 2, math.nan]), "v[2]"),
    (OrderedDict(a=1, b=[math.nan]), "v['b'][0]"),
    ({"a": "s", "b": 1, "c": None, "d": False, "e": {"f": [1, 2, 3, math.nan]}}, "v['e']['f'][3]"),
]  # fmt: skip

GOOD: list[Any] = [
    None, 1.5, -0.0, 10**30, [], {}, (), [1, "x", None, True], {"a": [1.0, 2.0], "b": ({"c": 1e300},)},
    [_Float(2.0), _List([3.0]), OrderedDict(a=4.0)], {"bytes": [1, 2, 3], "top": []},
]  # fmt: skip


@pytest.mark.parametrize(("value", "where"), BAD)
def test_non_finite_found_and_named(value: Any, where: str) -> None:
    with pytest.raises(ValueError, match="non-finite number at " + re.escape(where)):
        check_json_finite(value, "v")


@pytest.mark.parametrize("value", GOOD)
def test_finite_values_pass_unchanged(value: Any) -> None:
    assert check_json_finite(value, "v") is value
