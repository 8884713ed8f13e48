#!/usr/bin/env python3
"""Are two builds' kernels the same machine code? Compares the `.text.<kernel>` sections of the
sm_90a cubins embedded in two libflashback.so files, byte for byte, without cuobjdump.

    python3 scripts/fatbin_text_compare.py build-a/libflashback.so build-b/libflashback.so

For refactors that must not change a kernel. The cubins sit uncompressed in the library's
`.nv_fatbin` section (read here with objcopy); each is an ELF file whose `.text.<name>` sections
hold one function's SASS encoding. What nvcc derives from a file's path (hashes in
internal-linkage names) is dropped from the names before they are matched. Prints "same N,
differ M, only in A: X, only in B: Y" and each differing or unmatched function; exit status 1
if any.
"""
import os
import re
import struct
import subprocess
import sys
import tempfile


def fatbin(path):
    if not os.path.isfile(path):
        sys.exit(f"{path}: no such file")
    with tempfile.TemporaryDirectory() as tmp:
        out = os.path.join(tmp, "fatbin.bin")
        subprocess.run(["objcopy", "-O", "binary", "--only-section=.nv_fatbin", path, out], check=True)
        if not os.path.exists(out):
            return b""
        with open(out, "rb") as f:
            return f.read()


def normalise(name):
    """A function's name without what nvcc derives from the file's path: the hash in
    internal-linkage and anonymous-namespace names, the number it puts before static kernels."""
    name = re.sub(r"(_INTERNAL|_GLOBAL__N_)_\w{8}_\d+_\w+?_cu_\w{8}", "", name)
    return re.sub(r"\d+_\d+(reference_)", r"\1", name)


def elf_texts(e):
    """{function name: code bytes} of one ELF64 cubin."""
    shoff, = struct.unpack_from("<Q", e, 0x28)
    shentsize, shnum, shstrndx = struct.unpack_from("<HHH", e, 0x3A)
    secs = [struct.unpack_from("<IIQQQQ", e, shoff + i * shentsize) for i in range(shnum)]
    names_at = secs[shstrndx][4]
    out = {}
    for name, _typ, _flags, _addr, off, size in secs:
        n = e[names_at + name:e.index(b"\0", names_at + name)].decode()
        if n.startswith(".text."):
            out[normalise(n[6:])] = e[off:off + size]
    return out


def cubins(blob):
    """The ELF files in a fatbin, each cut at the next one's start."""
    starts = [m.start() for m in re.finditer(rb"\x7fELF\x02", blob)]
    return [blob[a:b] for a, b in zip(starts, starts[1:] + [len(blob)])]


def texts(blob):
    out = {}
    for cubin in cubins(blob):
        out.update(elf_texts(cubin))
    return out


def main():
    if len(sys.argv) != 3:
        sys.exit(__doc__)
    a, b = texts(fatbin(sys.argv[1])), texts(fatbin(sys.argv[2]))
    for path, found in ((sys.argv[1], a), (sys.argv[2], b)):
        if not found:
            sys.exit(f"{path}: no kernel code found in its .nv_fatbin section")
    differ = sorted(k for k in a.keys() & b.keys() if a[k] != b[k])
    for k in differ:
        print(f"differ ({len(a[k])} / {len(b[k])} bytes): {k}")
    for k in sorted(a.keys() - b.keys()):
        print(f"only in A: {k}")
    for k in sorted(b.keys() - a.keys()):
        print(f"only in B: {k}")
    same = len(a.keys() & b.keys()) - len(differ)
    print(f"same {same}, differ {len(differ)}, only in A: {len(a.keys() - b.keys())}, "
          f"only in B: {len(b.keys() - a.keys())}")
    return 1 if differ or a.keys() != b.keys() else 0


if __name__ == "__main__":
    sys.exit(main())
