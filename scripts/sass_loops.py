#!/usr/bin/env python3
"""The inner loops of a kernel's SASS, for comparing two kernels' main loops instruction by
instruction: each loop (a backward branch) that holds wgmma instructions, with its opcode counts
and, with --timeline, its instructions in order, runs of arithmetic folded into one line of
counts between the waits, barriers, branches and GEMM issues that structure a step.

    python3 scripts/sass_loops.py build/libflashback.so 'fwd_sm90_kernel.*Hdim128E.*DtypeE0'
    python3 scripts/sass_loops.py other_kernels.o 'FlashAttnFwdSm90.*Dynamic' --timeline

The input is a library or object file with an embedded fatbin (its cubins are taken out as in
fatbin_text_compare.py and disassembled with nvdisasm, from $NVDISASM or PATH; the
nvidia-cuda-nvdisasm wheel has one), or a text dump of `nvdisasm -c` or `cuobjdump -sass`.
The pattern is a regular expression on the mangled function name.
"""
import argparse
import collections
import os
import re
import shutil
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from fatbin_text_compare import cubins, fatbin  # noqa: E402

STRUCTURE = re.compile(r"BRA|HGMMA|WARPGROUP|SYNCS|BAR|CALL|SHFL")


def disassemble(path):
    """SASS text of every cubin in `path` (a dump is returned as it is)."""
    with open(path, "rb") as f:
        head = f.read(4)
    if head != b"\x7fELF":
        return open(path).read()
    tool = os.environ.get("NVDISASM") or shutil.which("nvdisasm")
    if not tool:
        sys.exit("nvdisasm not found: set NVDISASM or put it on PATH")
    out = []
    with tempfile.TemporaryDirectory() as tmp:
        for n, blob in enumerate(cubins(fatbin(path))):
            name = os.path.join(tmp, f"{n}.cubin")
            with open(name, "wb") as f:
                f.write(blob)
            out.append(subprocess.run([tool, "-c", name], capture_output=True, text=True, check=True).stdout)
    return "\n".join(out)


def functions(text):
    """{name: [(address, instruction)]} and {(name, label): address}."""
    funcs, labels, name, pending = {}, {}, None, []
    for line in text.split("\n"):
        m = re.match(r"\s*\.text\.(\S+):\s*$", line) or re.search(r"Function : (\S+)", line)
        if m:
            name = m.group(1)
            funcs[name] = []
            continue
        m = re.match(r"\s*(\.L_x_\d+):", line)
        if m:
            pending.append(m.group(1))
            continue
        m = re.search(r"/\*([0-9a-f]{4,})\*/\s+(.*?)\s*;", line)
        if m and name:
            addr = int(m.group(1), 16)
            for label in pending:
                labels[(name, label)] = addr
            pending = []
            funcs[name].append((addr, m.group(2)))
    return funcs, labels


def opcode(ins):
    return re.sub(r"^@!?U?P\w+\s+", "", ins).split()[0]


def loops(name, body, labels):
    """(start, end, instructions) of every backward branch's range that holds a wgmma."""
    found = []
    for addr, ins in body:
        if not re.search(r"\bBRA\b", ins):
            continue
        m = re.search(r"\((\.L_x_\d+)\)", ins) or re.search(r"0x([0-9a-f]+)", ins)
        if not m:
            continue
        target = labels.get((name, m.group(1))) if m.group(1).startswith(".L") else int(m.group(1), 16)
        if target is None or target >= addr:
            continue
        seg = [(a, i) for a, i in body if target <= a <= addr]
        if any("HGMMA" in i for _, i in seg):
            found.append((target, addr, seg))
    return found


def counts(instructions, top):
    c = collections.Counter(opcode(i) for i in instructions)
    return ", ".join(f"{k} {v}" for k, v in c.most_common(top))


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("input")
    p.add_argument("pattern")
    p.add_argument("--timeline", action="store_true", help="each loop's instructions in order, folded")
    p.add_argument("--top", type=int, default=16, help="opcodes per count line (default 16)")
    a = p.parse_args()
    funcs, labels = functions(disassemble(a.input))
    matched = [n for n in funcs if re.search(a.pattern, n)]
    if not matched:
        sys.exit(f"no function matches {a.pattern!r} ({len(funcs)} functions)")
    for name in matched:
        body = funcs[name]
        print(f"{name}: {len(body)} instructions")
        for start, end, seg in loops(name, body, labels):
            ins = [i for _, i in seg]
            print(f"  loop {start:#x}-{end:#x}: {len(ins)} instructions, "
                  f"{sum('HGMMA' in i for i in ins)} HGMMA")
            print(f"    {counts(ins, a.top)}")
            if a.timeline:
                run = []
                for addr, i in seg:
                    if STRUCTURE.search(i):
                        if run:
                            print(f"      [{len(run)}: {counts(run, 6)}]")
                            run = []
                        print(f"    {addr:6x}  {i[:100]}")
                    else:
                        run.append(i)
                if run:
                    print(f"      [{len(run)}: {counts(run, 6)}]")


if __name__ == "__main__":
    main()
