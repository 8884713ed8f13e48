"""scripts/fatbin_text_compare.py on fabricated cubins: code sections matched by name (less the
path-derived parts of internal names) and compared byte for byte."""
import importlib.util
import os
import shutil
import struct
import subprocess

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
spec = importlib.util.spec_from_file_location("ftc", os.path.join(ROOT, "scripts", "fatbin_text_compare.py"))
ftc = importlib.util.module_from_spec(spec)
spec.loader.exec_module(ftc)


def cubin(sections):
    """A minimal ELF64 file: a null section, the named sections, the section-name table last."""
    names = b"\0"
    offs = []
    for name, _ in sections:
        offs.append(len(names))
        names += name.encode() + b"\0"
    shstr_name = len(names)
    names += b".shstrtab\0"
    body = b""
    places = []
    for _, data in sections:
        places.append((64 + len(body), len(data)))
        body += data
    names_at = 64 + len(body)
    body += names
    shoff = 64 + len(body)
    shnum = len(sections) + 2
    header = bytearray(64)
    header[0:5] = b"\x7fELF\x02"
    struct.pack_into("<Q", header, 0x28, shoff)
    struct.pack_into("<HHH", header, 0x3A, 64, shnum, shnum - 1)
    shdrs = bytes(64)  # the null section
    for (off, size), name in zip(places, offs):
        shdrs += struct.pack("<IIQQQQ", name, 1, 6, 0, off, size) + bytes(24)
    shdrs += struct.pack("<IIQQQQ", shstr_name, 3, 0, 0, names_at, len(names)) + bytes(24)
    return bytes(header) + body + shdrs


KERNEL = "_ZN9flashback4sm9015fwd_sm90_kernelIiEEvv"
INTERNAL = "_ZN50_INTERNAL_427f428a_19_fwd_sm90_hdim128_cu_655b4d4a9flashback5helperEv"
INTERNAL_OTHER_PATH = "_ZN50_INTERNAL_9e1c03bb_19_fwd_sm90_hdim128_cu_0d2f77aa9flashback5helperEv"


def test_texts_match_by_name_across_cubins_and_paths():
    a = b"fatbin header" + cubin([(".text." + KERNEL, b"\x01\x02"), (".nv.info", b"x")]) + \
        cubin([(".text." + INTERNAL, b"\x03")])
    b = b"other header" + cubin([(".text." + INTERNAL_OTHER_PATH, b"\x03")]) + \
        cubin([(".text." + KERNEL, b"\x01\x02")])
    ta, tb = ftc.texts(a), ftc.texts(b)
    assert set(ta) == {KERNEL, ftc.normalise(INTERNAL)}  # .nv.info is not code
    assert ta == tb
    c = cubin([(".text." + KERNEL, b"\x01\x03")]) + cubin([(".text." + INTERNAL, b"\x03")])
    tc = ftc.texts(c)
    assert tc[KERNEL] != ta[KERNEL] and tc[ftc.normalise(INTERNAL)] == ta[ftc.normalise(INTERNAL)]


def test_normalise_keeps_what_names_the_function():
    assert ftc.normalise(INTERNAL) == ftc.normalise(INTERNAL_OTHER_PATH)
    assert "helper" in ftc.normalise(INTERNAL)
    assert ftc.normalise("_ZN9flashback3ref57_540123reference_bwd_dq_kernelILi64EEEvv") == \
        ftc.normalise("_ZN9flashback3ref57_591023reference_bwd_dq_kernelILi64EEEvv")
    assert ftc.normalise(KERNEL) == KERNEL


@pytest.mark.skipif(shutil.which("objcopy") is None or shutil.which("cc") is None, reason="needs objcopy and cc")
def test_main_on_two_libraries(tmp_path):
    src = tmp_path / "x.c"
    src.write_text("int x(void) { return 1; }\n")
    base = tmp_path / "base.so"
    subprocess.run(["cc", "-shared", "-o", str(base), str(src)], check=True)
    libs = []
    for n, code in enumerate((b"\x01\x02", b"\x01\x02", b"\x09\x02")):
        blob = tmp_path / f"fb{n}.bin"
        blob.write_bytes(b"hdr" + cubin([(".text." + KERNEL, code)]))
        lib = tmp_path / f"lib{n}.so"
        subprocess.run(["objcopy", "--add-section", f".nv_fatbin={blob}", "--set-section-flags",
                        ".nv_fatbin=alloc,contents,load,readonly,data", str(base), str(lib)], check=True)
        libs.append(str(lib))
    script = os.path.join(ROOT, "scripts", "fatbin_text_compare.py")
    same = subprocess.run(["python3", script, libs[0], libs[1]], capture_output=True, text=True)
    assert same.returncode == 0 and "same 1, differ 0" in same.stdout, same.stdout + same.stderr
    differ = subprocess.run(["python3", script, libs[0], libs[2]], capture_output=True, text=True)
    assert differ.returncode == 1 and "same 0, differ 1" in differ.stdout, differ.stdout + differ.stderr
    empty = subprocess.run(["python3", script, str(base), libs[0]], capture_output=True, text=True)
    assert empty.returncode != 0 and "no kernel code found" in empty.stderr, empty.stdout + empty.stderr
