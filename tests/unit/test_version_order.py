"""``registry.repository.version_key`` orders versions exactly as ``semver.Version``
compares them (the precedence SemVer defines, build metadata ignored)."""

from __future__ import annotations

import semver
from hypothesis import given, settings
from hypothesis import strategies as st

from registry.repository import version_key

_IDENTIFIER = st.one_of(
    st.sampled_from(["0", "1", "2", "10", "alpha", "beta", "rc", "a1", "1a", "-", "x-y", "0a"]),
    st.from_regex(r"[0-9A-Za-z-]{1,4}", fullmatch=True),
).filter(lambda s: not (s.isdigit() and s != "0" and s.startswith("0")))  # SemVer refuses 007
_VERSION = st.builds(
    lambda core, pre, build: (
        ".".join(map(str, core))
        + (f"-{'.'.join(pre)}" if pre else "")
        + (f"+{'.'.join(build)}" if build else "")
    ),
    st.tuples(*[st.integers(0, 12)] * 3),
    st.lists(_IDENTIFIER, max_size=3),
    st.lists(st.sampled_from(["b1", "001", "sha"]), max_size=2),
)


def _sign(n: int) -> int:
    return (n > 0) - (n < 0)


@settings(max_examples=800, deadline=None)
@given(_VERSION, _VERSION)
def test_the_key_compares_as_semver_does(a: str, b: str) -> None:
    expected = semver.Version.parse(a).compare(semver.Version.parse(b))
    ka, kb = version_key(a), version_key(b)
    assert _sign((ka > kb) - (ka < kb)) == _sign(expected), (a, b)


def test_sorted_versions_are_in_semver_order() -> None:
    names = ["1.10.0", "1.2.0", "1.2.0-rc.10", "1.2.0-rc.2", "1.2.0-alpha", "0.9.9", "1.2.0-rc.a"]
    ordered = sorted(names, key=version_key)
    assert ordered == [
        "0.9.9", "1.2.0-alpha", "1.2.0-rc.2", "1.2.0-rc.10", "1.2.0-rc.a", "1.2.0", "1.10.0",
    ]  # fmt: skip
