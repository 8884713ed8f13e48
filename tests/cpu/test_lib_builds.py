"""Two builds of the native library in one process (flashback._lib.load_file / using, for the
benchmark's --builds): each file gets its own handle, `using` routes load() to it and restores
the default after, a missing file says so. No GPU needed."""
import ctypes
import shutil

import pytest

from flashback import _lib


@pytest.fixture(scope="module")
def default():
    if not _lib.is_loadable():
        pytest.skip("libflashback.so is not built")
    return _lib.load()


def test_a_second_build_loads_beside_the_default(default, tmp_path):
    copy = tmp_path / "libflashback.so"
    shutil.copy(default._name, copy)
    other = _lib.load_file(copy)
    assert other is not default and other._handle != default._handle
    # Both answer: the second file's functions are its own (not resolved to the first's).
    assert other.flashback_version() == default.flashback_version()
    address = lambda lib: ctypes.cast(lib.flashback_attention_forward, ctypes.c_void_p).value  # noqa: E731
    assert address(other) != address(default)
    with _lib.using(other) as lib:
        assert lib is other and _lib.load() is other
        with _lib.using(default):
            assert _lib.load() is default
        assert _lib.load() is other
    assert _lib.load() is default


def test_using_restores_after_an_error(default, tmp_path):
    copy = tmp_path / "libflashback.so"
    shutil.copy(default._name, copy)
    other = _lib.load_file(copy)
    with pytest.raises(RuntimeError, match="inside"):
        with _lib.using(other):
            raise RuntimeError("inside")
    assert _lib.load() is default


def test_load_file_of_a_missing_file(tmp_path):
    with pytest.raises(_lib.LibraryNotFoundError, match="not found"):
        _lib.load_file(tmp_path / "nope.so")
