"""scripts/sass_mix.py on two small source pages of the form `ncu --page source --csv` writes."""
import os
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(ROOT, "scripts"))

import sass_mix  # noqa: E402

HEADER = ["Address", "Source", "Warp Stall Sampling (All Samples)", "Instructions Executed"]
# A: a loop body run 1000 times (4 lines, one a clock read), a tile tail run 10 times (2 lines).
OURS = [
    ["0x10", "CS2R R4, SR_CLOCKLO", "0", "1000"],
    ["0x20", "FFMA R1, R2, R3, R4", "0", "1000"],
    ["0x30", "@!P0 FMNMX R1, R2, R3, !PT", "0", "1000"],
    ["0x40", "SYNCS.PHASECHK.TRANS64.TRYWAIT P0, [R7+URZ], R0", "0", "1000"],
    ["0x50", "MUFU.RCP R9, R8", "0", "10"],
    ["0x60", "EXIT", "0", "10"],
    ["0x70", "BRA 0x70", "0", "0"],
]
# B: the same loop without the clock read, flushing denormals, run 1100 times; the same tail.
THEIRS = [
    ["0x10", "FFMA.FTZ R1, R2, R3, R4", "0", "1100"],
    ["0x20", "FMNMX.FTZ R1, R2, R3, !PT", "0", "1100"],
    ["0x30", "SYNCS.PHASECHK.TRANS64.TRYWAIT P0, [R7+URZ], R0", "0", "1100"],
    ["0x40", "MUFU.RCP R9, R8", "0", "10"],
    ["0x50", "EXIT", "0", "10"],
]


def write_page(path, body):
    lines = ['"Kernel Name","k"', ",".join(f'"{h}"' for h in HEADER)]
    lines += [",".join(f'"{c}"' for c in r) for r in body]
    path.write_text("\n".join(lines) + "\n")


def test_opcode_drops_predicates_and_ftz():
    assert sass_mix.opcode("@!P0 FMNMX.FTZ R1, R2, R3, !PT") == "FMNMX"
    assert sass_mix.opcode("@UP1 UIADD3.64 UR22, UR18, 0x80, URZ") == "UIADD3.64"
    assert sass_mix.opcode("  CS2R R4, SR_CLOCKLO") == "CS2R"


def test_counts_per_opcode_and_per_region(tmp_path):
    a = tmp_path / "a.csv"
    write_page(a, OURS)
    lines = sass_mix.executed(str(a))
    assert sum(n for _, n in lines) == 4020
    mix = sass_mix.by_opcode(lines)
    assert mix["FMNMX"] == 1000 and mix["CS2R"] == 1000 and mix["EXIT"] == 10
    # Regions by execution count; the line never run is no region.
    assert sass_mix.groups(lines) == {1000: 4, 10: 2}
    assert sass_mix.by_opcode(lines, only_count=1000) == {"CS2R": 1, "FFMA": 1, "FMNMX": 1,
                                                         "SYNCS.PHASECHK.TRANS64.TRYWAIT": 1}


def test_cli_compares_the_two_pages(tmp_path):
    a, b = tmp_path / "a.csv", tmp_path / "b.csv"
    write_page(a, OURS)
    write_page(b, THEIRS)
    r = subprocess.run([sys.executable, os.path.join(ROOT, "scripts", "sass_mix.py"), str(a), str(b),
                        "--count", "1000", "1100"], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    out = r.stdout
    assert "(+21.1% A against B)" in out  # 4020 against 3320 executed
    # The clock read is the largest opcode difference (+1000; FFMA and FMNMX -100 each).
    first = out.split("A - B\n")[1].splitlines()[0].split()
    assert first[0] == "CS2R" and first[-1] == "+0.00"
    assert "ran       1100 x     3 lines" in out
    # Per region, only the opcodes that differ: the clock read.
    tail = out.split("per opcode:")[1]
    assert "CS2R" in tail and "FFMA" not in tail and "FMNMX" not in tail
