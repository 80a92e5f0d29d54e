"""`origins.upstream.check_resumed`: a resumed body is taken only when the origin's 206
carries exactly the bytes asked for, of the same object; anything else, an origin's
absurd numbers included, is a refusal the fill handles."""

from __future__ import annotations

import pytest

from sidecar.origins.upstream import CannotResume, check_resumed

SIZE = 1000


@pytest.mark.parametrize("content_range", ["bytes 100-199/1000", "bytes 100-199/*"])
def test_the_range_asked_for_is_taken(content_range: str) -> None:
    check_resumed(206, {"Content-Range": content_range}, 100, 200, SIZE)


@pytest.mark.parametrize(
    ("status", "content_range"),
    [
        (200, "bytes 100-199/1000"),  # If-Range failed: another object, whole
        (206, "bytes 100-198/1000"),
        (206, "bytes 0-199/1000"),
        (206, "bytes 100-199/1001"),  # another size: another object
        (206, ""),
        (206, "bytes 100-199"),
        (206, "items 100-199/1000"),
        (206, "bytes " + "0" * 5000 + "100-199/1000"),
        (206, "bytes 100-" + "9" * 5000 + "/1000"),
        (206, "bytes 100-199/" + "1" * 5000),
    ],
)
def test_anything_else_is_refused(status: int, content_range: str) -> None:
    with pytest.raises(CannotResume):
        check_resumed(status, {"Content-Range": content_range}, 100, 200, SIZE)
