"""The Hopper kernels' candidate configs: every config in the headers that no table row uses is
compiled by the candidates target (so a change that breaks one shows in CI), and
scripts/build_candidates.sh can put each in place of its head dim's row."""
import os
import re
import subprocess
import sys

from sm90_configs import HEADERS, ROOT, header_text, initializer
ROW = re.compile(r"k(Fwd|Bwd)Sm90Hdim(64|128|192|256)(Full|FullLong|Det|Single|Multi)?$")


def configs(kind):
    return re.findall(r"constexpr %sSm90Config (k\w+) = \{" % kind, header_text(kind))


def candidates():
    return [c for kind in HEADERS for c in configs(kind) if not ROW.match(c)]


def test_rows_are_defined():
    for kind in HEADERS:
        names = configs(kind)
        for d in (64, 128, 192, 256):
            assert f"k{kind}Sm90Hdim{d}" in names


def test_every_candidate_is_compiled():
    compiled = open(os.path.join(ROOT, "csrc/candidates/sm90_candidates.cu")).read()
    found = candidates()
    assert found, "no candidate configs found: the header layout changed"
    missing = [c for c in found if not re.search(r"FLASHBACK_(FWD|BWD)_CANDIDATE\(%s\)" % c, compiled)]
    assert not missing, f"candidates not compiled by csrc/candidates/sm90_candidates.cu: {missing}"
    listed = re.findall(r"FLASHBACK_(?:FWD|BWD)_CANDIDATE\((k\w+)\)", compiled)
    assert sorted(set(listed)) == sorted(set(found)), "the candidates target names a config the headers lack"


def substitution_script(tmp_path):
    """build_candidates.sh's substitution step (its embedded Python) as tmp_path/sub.py."""
    text = open(os.path.join(ROOT, "scripts/build_candidates.sh")).read()
    script = re.search(r"<<'PYEOF'\n(.*?)\nPYEOF", text, re.S).group(1)
    (tmp_path / "sub.py").write_text(script)


def test_build_candidates_substitutes_each(tmp_path):
    """The substitution step of build_candidates.sh (its embedded Python) on a copy of the headers."""
    substitution_script(tmp_path)
    for kind, path in HEADERS.items():
        os.makedirs(tmp_path / os.path.dirname(path), exist_ok=True)
    for cand in candidates():
        kind = "Fwd" if cand.startswith("kFwd") else "Bwd"
        d = re.match(r"k\w+Hdim(\d+)", cand).group(1)
        for path in HEADERS.values():
            (tmp_path / path).write_text(open(os.path.join(ROOT, path)).read())
        row = f"k{kind}Sm90Hdim{d}"
        r = subprocess.run([sys.executable, str(tmp_path / "sub.py"), str(tmp_path), row, cand],
                           capture_output=True, text=True)
        assert r.returncode == 0, (cand, r.stdout, r.stderr)
        new = (tmp_path / HEADERS[kind]).read_text()
        init = re.search(r"constexpr %sSm90Config %s = (\{[^}]*\});" % (kind, cand), new).group(1)
        assert f"constexpr {kind}Sm90Config {row} = {init};" in new, cand


def test_value_candidates_substitute(tmp_path):
    """Candidates that are plain values of their own struct (not a table row's config) swap in
    the same way: build_candidates.sh ROW=CANDIDATE on the header that defines both (a header of
    the form of kFwdSm90L2 / kBwdSm90L2)."""
    substitution_script(tmp_path)
    path = tmp_path / "csrc" / "bwd_sm90" / "example.h"
    os.makedirs(path.parent, exist_ok=True)
    path.write_text("struct WalkConfig {\n  bool skip;\n  int n;\n};\n"
                    "constexpr WalkConfig kWalk = {false, 1};\n"
                    "constexpr WalkConfig kWalkSkip = {true, 2};\n")
    r = subprocess.run([sys.executable, str(tmp_path / "sub.py"), str(tmp_path), "kWalk", "kWalkSkip"],
                       capture_output=True, text=True)
    assert r.returncode == 0, (r.stdout, r.stderr)
    new = path.read_text()
    assert "constexpr WalkConfig kWalk = {true, 2};" in new, new
    assert "constexpr WalkConfig kWalkSkip = {true, 2};" in new, new
    # The value candidates waiting in the headers (kFwdSm90L2Short ...): each swaps into its row.
    for rel in HEADERS.values():
        text = open(os.path.join(ROOT, rel)).read()
        for struct, cand in re.findall(r"constexpr (\w+Sm90L2) (k\w+) = \{", text):
            row = "k" + struct
            if cand == row:
                continue
            real = tmp_path / rel
            real.parent.mkdir(parents=True, exist_ok=True)
            real.write_text(text)
            r = subprocess.run([sys.executable, str(tmp_path / "sub.py"), str(tmp_path), row, cand],
                               capture_output=True, text=True)
            assert r.returncode == 0, (cand, r.stdout, r.stderr)
            m = re.search(r"constexpr %s %s = (\{[^}]*\});" % (struct, cand), real.read_text())
            assert m and f"constexpr {struct} {row} = {m.group(1)};" in real.read_text(), cand
            real.unlink()
    # A candidate the headers lack is an error, not a silent no-op.
    r = subprocess.run([sys.executable, str(tmp_path / "sub.py"), str(tmp_path), "kWalk", "kWalkNone"],
                       capture_output=True, text=True)
    assert r.returncode != 0


def test_d192_runs_the_measured_lean_softmax_config():
    """kFwdSm90Hdim192Multi, which serves every d = 192 forward (tests/cpu/test_fwd_dispatch.py),
    is the measured candidate kFwdSm90Hdim192MultiLs (e5523ee): lean_softmax on (the 20th field),
    rescale_between at its default, nothing else changed."""
    measured = ("192, 112, 2, 2, 24, 240, false, true, true, true, true, false, true, false, false, "
                "false, false, true, false, true").split(", ")
    assert initializer("Fwd", "kFwdSm90Hdim192Multi") == measured
