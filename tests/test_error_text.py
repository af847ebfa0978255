"""How messages quote library errors and say sizes."""
import pytest

from lightning_dpgan.error_text import byte_size, first_line


@pytest.mark.parametrize("count,said", [
    (0, "0 bytes"), (1000, "1000 bytes"), (1024, "1.0 KiB"), (300 * 2**20, "300.0 MiB"),
    (2**30 - 1, "1024.0 MiB"), (1.5 * 2**30, "1.5 GiB"), (3 * 2**40, "3.0 TiB"),
])
def test_a_size_is_said_in_the_largest_unit_it_reaches_one_of(count, said):
    """A disk with 300 MiB left read "0.0 GiB free"."""
    assert byte_size(count) == said


def test_a_library_error_is_quoted_by_its_first_line_or_its_type():
    assert first_line(RuntimeError("\n  shapes do not match.\n  dispatcher tables ...")) == "shapes do not match"
    assert first_line(KeyError()) == "KeyError"
