"""What the wheel's tag promises, held to the library that was built.

The wheel is tagged py3-none-manylinux_2_X_x86_64: no Python ABI (the library is reached through
ctypes), glibc 2.X or newer, and nothing from the CUDA toolkit (the runtime is linked in
statically; the driver's libcuda.so.1 is opened at run time). The tag is written in
pyproject.toml by hand, so a build on a newer system could need more than it says; these tests
read the library's ELF dynamic section and symbol versions to catch that. With
FLASHBACK_TEST_INSTALLED=1 (as .ci/run runs the suite against the installed wheel) they also
check that the package and library under test are the installed ones, not the checkout's.
"""
import importlib.metadata
import os
import pathlib
import re
import struct

import pytest

import flashback
from flashback import _lib

ROOT = pathlib.Path(__file__).resolve().parents[2]
INSTALLED = os.environ.get("FLASHBACK_TEST_INSTALLED") == "1"

# What a manylinux wheel may take from the system instead of shipping it (PEP 599/600).
SYSTEM_LIBS = {"libc.so.6", "libm.so.6", "libdl.so.2", "librt.so.1", "libpthread.so.0",
               "libstdc++.so.6", "libgcc_s.so.1", "ld-linux-x86-64.so.2"}

SHT_DYNAMIC, SHT_GNU_VERNEED = 6, 0x6FFFFFFE
DT_NULL, DT_NEEDED, DT_RPATH, DT_RUNPATH = 0, 1, 15, 29


def elf_dependencies(path):
    """(DT_NEEDED names, RPATH/RUNPATH entries, {library: symbol versions it needs}) of a 64-bit
    little-endian ELF; parsed here so the check needs no binutils."""
    data = pathlib.Path(path).read_bytes()
    assert data[:6] == b"\x7fELF\x02\x01", f"{path} is not a 64-bit little-endian ELF file"
    (shoff,) = struct.unpack_from("<Q", data, 0x28)
    shentsize, shnum = struct.unpack_from("<HH", data, 0x3A)
    sections = [struct.unpack_from("<IIQQQQIIQQ", data, shoff + i * shentsize) for i in range(shnum)]

    def string(table, offset):
        start = sections[table][4] + offset
        return data[start:data.index(b"\0", start)].decode()

    needed, search_paths, versions = [], [], {}
    for _, kind, _, _, offset, size, link, info, _, _ in sections:
        if kind == SHT_DYNAMIC:
            for pos in range(offset, offset + size, 16):
                tag, value = struct.unpack_from("<qQ", data, pos)
                if tag == DT_NULL:
                    break
                if tag == DT_NEEDED:
                    needed.append(string(link, value))
                elif tag in (DT_RPATH, DT_RUNPATH):
                    search_paths.append(string(link, value))
        elif kind == SHT_GNU_VERNEED:
            pos = offset
            for _ in range(info):
                _, count, file_name, aux, next_entry = struct.unpack_from("<HHIII", data, pos)
                names = versions.setdefault(string(link, file_name), set())
                aux_pos = pos + aux
                for _ in range(count):
                    _, _, _, name, next_aux = struct.unpack_from("<IHHII", data, aux_pos)
                    names.add(string(link, name))
                    aux_pos += next_aux
                pos += next_entry
    return needed, search_paths, versions


def wheel_tag():
    """The installed wheel's tag, or the one pyproject.toml gives wheels built from this checkout."""
    if INSTALLED:
        wheel = importlib.metadata.distribution("flashback").read_text("WHEEL")
        tags = re.findall(r"^Tag: (\S+)$", wheel, re.M)
    else:
        tags = re.findall(r'^wheel\.tags = \["([^"]+)"\]', (ROOT / "pyproject.toml").read_text(), re.M)
    assert len(tags) == 1, tags
    return tags[0]


@pytest.fixture(scope="module")
def library():
    if not _lib.is_loadable():
        pytest.skip("the native library is not built")
    return pathlib.Path(_lib.load()._name)


def test_library_needs_no_cuda_toolkit(library):
    needed, search_paths, _ = elf_dependencies(library)
    assert set(needed) <= SYSTEM_LIBS, f"{library} needs {sorted(set(needed) - SYSTEM_LIBS)}"
    # The driver is opened with dlopen by the static CUDA runtime, so a machine without a GPU
    # can still load the library (and report that no GPU is there).
    assert b"libcuda.so.1\0" in library.read_bytes()
    if INSTALLED:
        # A search path would point at directories of the machine that built the wheel.
        assert search_paths == [], search_paths


def test_tag_claims_no_python_abi_and_enough_glibc(library):
    tag = wheel_tag()
    match = re.fullmatch(r"py3-none-manylinux_(\d+)_(\d+)_x86_64", tag)
    assert match, tag
    claimed = (int(match[1]), int(match[2]))
    _, _, versions = elf_dependencies(library)
    glibc = {v for names in versions.values() for v in names if v.startswith("GLIBC_")}
    assert glibc, versions
    assert "GLIBC_PRIVATE" not in glibc
    newest = max(tuple(int(x) for x in re.fullmatch(r"GLIBC_(\d+)\.(\d+)(?:\.\d+)?", v).groups()) for v in glibc)
    assert newest <= claimed, (f"{library.name} needs GLIBC_{newest[0]}.{newest[1]}, newer than the tag {tag}; "
                               "build the wheel on an older glibc or raise the tag in pyproject.toml")


@pytest.mark.skipif(not INSTALLED, reason="checks an installed wheel (FLASHBACK_TEST_INSTALLED=1)")
def test_installed_package_and_library_are_the_ones_imported(library):
    package = pathlib.Path(flashback.__file__).resolve().parent
    assert ROOT not in package.parents, f"flashback was imported from the checkout: {package}"
    assert os.environ.get("FLASHBACK_LIBRARY") is None
    assert library.resolve() == package / "libflashback.so"
    files = {str(f) for f in importlib.metadata.distribution("flashback").files}
    assert "flashback/libflashback.so" in files and "flashback/_lib.py" in files, sorted(files)
