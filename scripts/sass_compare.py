#!/usr/bin/env python3
"""Which kernels two builds compile differently: per function, are the SASS instruction streams
of two `cuobjdump -sass` dumps the same? For refactors that must not change a kernel (a config
value generalised, a name changed): equal SASS is equal behaviour, with no GPU needed.

    cuobjdump -sass build-a/libflashback.so > a.sass
    cuobjdump -sass build-b/libflashback.so > b.sass
    python3 scripts/sass_compare.py a.sass b.sass [--filter bwd_sm90_kernel]

Compares the instructions (not their addresses or encodings) of each function both dumps have;
prints every function that differs with both instruction counts, the functions only one dump
has, and a last line "same N, differ M, only in A: X, only in B: Y". Exit status 1 when any
function differs or is missing from one side.
"""
import argparse
import re
import sys


def functions(path):
    """{mangled name: [instruction text, ...]} of one dump."""
    funcs, name, body = {}, None, []
    with open(path) as f:
        for line in f:
            m = re.search(r"Function : (\S+)", line)
            if m:
                if name is not None:
                    funcs[name] = body
                name, body = m.group(1), []
                continue
            m = re.match(r"\s+/\*[0-9a-f]+\*/\s+(.*?);", line)
            if m and name is not None:
                body.append(m.group(1).strip())
    if name is not None:
        funcs[name] = body
    return funcs


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("a")
    p.add_argument("b")
    p.add_argument("--filter", default="", help="only functions whose mangled name contains this")
    args = p.parse_args()
    a = {k: v for k, v in functions(args.a).items() if args.filter in k}
    b = {k: v for k, v in functions(args.b).items() if args.filter in k}
    same = differ = 0
    for name in sorted(a.keys() & b.keys()):
        if a[name] == b[name]:
            same += 1
        else:
            differ += 1
            print(f"differs: {name} ({len(a[name])} / {len(b[name])} instructions)")
    only_a, only_b = sorted(a.keys() - b.keys()), sorted(b.keys() - a.keys())
    for name in only_a:
        print(f"only in {args.a}: {name}")
    for name in only_b:
        print(f"only in {args.b}: {name}")
    print(f"same {same}, differ {differ}, only in A: {len(only_a)}, only in B: {len(only_b)}")
    return 1 if differ or only_a or only_b else 0


if __name__ == "__main__":
    sys.exit(main())
