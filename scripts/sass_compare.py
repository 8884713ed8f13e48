#!/usr/bin/env python3
"""Which kernels two builds compile differently: per function, are the SASS instruction streams
of two `cuobjdump -sass` dumps the same? For refactors that must not change a kernel (a config
value generalised, a name changed): equal SASS is equal behaviour, with no GPU needed.

    cuobjdump -sass build-a/libflashback.so > a.sass
    cuobjdump -sass build-b/libflashback.so > b.sass
    python3 scripts/sass_compare.py a.sass b.sass [--filter bwd_sm90_kernel]
    python3 scripts/sass_compare.py prod.sass cand.sass --anon --rename kFwdSm90Hdim64TmaTail=kFwdSm90Hdim64Multi

--anon names the anonymous namespaces' functions alike in both dumps (their mangled names carry a
hash of the source path, which differs between two checkouts). --rename OLD=NEW (repeatable)
reads config OLD in dump A's names as NEW, so that a candidate's kernel, measured under its own
name, is compared with the production kernel it became.

--loop also says, for each function that differs, how many lines of its main loop differ:
the span from its first to its last HGMMA, registers, predicates and immediates made alike, so
that a renumbering counts nothing and a reordering or a changed instruction counts. A change
outside the loop (a kernel's prologue or epilogue) has moved ptxas's schedule of the loop when
this is not 0: in the d = 256 backward such moves measured -2..-5% (docs/perf-log.md, "ptxas's
schedule of the main loop"), so check it before spending GPU time on such a change.

Compares the instructions (not their addresses or encodings) of each function both dumps have;
prints every function that differs with both instruction counts, the functions only one dump
has, and a last line "same N, differ M, only in A: X, only in B: Y". Exit status 1 when any
function differs or is missing from one side.
"""
import argparse
import difflib
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


# An anonymous namespace's mangled name: <length>_GLOBAL__N__<hash>_<n>_<file>_cu_<hash>.
ANON = re.compile(r"[0-9]+_GLOBAL__N__[0-9a-f]+_[0-9]+_[A-Za-z0-9_]+?_cu_[0-9a-f]+")


def normalize(name, anon=False, renames=()):
    """A mangled name with the anonymous namespaces made alike (anon) and each config OLD of
    `renames` ((OLD, NEW) pairs) written as NEW, its length prefix with it."""
    if anon:
        # Then the length of what follows, where the hash's match stopped at an underscore
        # (e.g. ANON_25reference_...): it differs with the hash's digits.
        name = re.sub(r"ANON_[0-9]+(?=[A-Za-z])", "ANON_", ANON.sub("ANON", name))
    for old, new in renames:
        # The length prefix bounds the identifier: 14kFwdSm90Hdim64 is not the start of
        # 19kFwdSm90Hdim64Multi.
        name = re.sub(rf"(?<![0-9]){len(old)}{re.escape(old)}", f"{len(new)}{new}", name)
    return name


def loop_lines(body):
    """The instructions from the first to the last HGMMA, registers (R, UR), predicates (P, UP),
    barriers (B) and hex immediates made alike; [] without an HGMMA."""
    idx = [i for i, ins in enumerate(body) if ins.startswith("HGMMA")]
    if not idx:
        return []
    out = []
    for ins in body[idx[0]:idx[-1] + 1]:
        ins = re.sub(r"0x[0-9a-f]+", "X", ins)
        ins = re.sub(r"\bU?R[0-9]+\b", "R", ins)
        ins = re.sub(r"\bU?P[0-9]\b", "P", ins)
        out.append(re.sub(r"\bB[0-9]+\b", "B", ins))
    return out


def loop_diff(a, b):
    """(lines of the main loop that differ, the loop's length in A) for two instruction lists."""
    la, lb = loop_lines(a), loop_lines(b)
    ops = difflib.SequenceMatcher(None, la, lb, autojunk=False).get_opcodes()
    return sum(max(i2 - i1, j2 - j1) for op, i1, i2, j1, j2 in ops if op != "equal"), len(la)


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("a")
    p.add_argument("b")
    p.add_argument("--filter", default="", help="only functions whose mangled name contains this")
    p.add_argument("--anon", action="store_true", help="anonymous namespaces alike in both dumps")
    p.add_argument("--rename", action="append", default=[], metavar="OLD=NEW",
                   help="read config OLD in A's function names as NEW (repeatable)")
    p.add_argument("--loop", action="store_true",
                   help="for each function that differs, the lines of its main loop (HGMMA span) that differ")
    args = p.parse_args()
    renames = []
    for r in args.rename:
        old, sep, new = r.partition("=")
        if not sep or not old or not new:
            p.error(f"--rename takes OLD=NEW, got {r!r}")
        renames.append((old, new))
    a = {normalize(k, args.anon, renames): v for k, v in functions(args.a).items()}
    b = {normalize(k, args.anon): v for k, v in functions(args.b).items()}
    a = {k: v for k, v in a.items() if args.filter in k}
    b = {k: v for k, v in b.items() if args.filter in k}
    same = differ = 0
    for name in sorted(a.keys() & b.keys()):
        if a[name] == b[name]:
            same += 1
        else:
            differ += 1
            loop = ""
            if args.loop:
                n, length = loop_diff(a[name], b[name])
                loop = f"; main loop: {n} of {length} lines differ"
            print(f"differs: {name} ({len(a[name])} / {len(b[name])} instructions{loop})")
    only_a, only_b = sorted(a.keys() - b.keys()), sorted(b.keys() - a.keys())
    for name in only_a:
        print(f"only in {args.a}: {name}")
    for name in only_b:
        print(f"only in {args.b}: {name}")
    print(f"same {same}, differ {differ}, only in A: {len(only_a)}, only in B: {len(only_b)}")
    return 1 if differ or only_a or only_b else 0


if __name__ == "__main__":
    sys.exit(main())
