"""scripts/sass_hotspots.py on a small source page of the form `ncu --page source --csv` writes."""
import os
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(ROOT, "scripts"))

import sass_hotspots  # noqa: E402

HEADER = ["Address", "Source", "Warp Stall Sampling (All Samples)", "Instructions Executed",
          "stall_long_sb", "stall_wait"]
ROWS = [
    ["0x10", "SYNCS.PHASECHK.TRANS64.TRYWAIT P1, [UR10], R0", "2", "100", "0", "2"],
    ["0x20", "@P1   BRA 0x40", "40", "100", "40", "0"],
    ["0x30", "HGMMA.64x80x16.F32.BF16 R152, gdesc[UR32], RZ, !UPT", "30", "100", "0", "30"],
    ["0x40", "DEPBAR.LE SB0, 0x0", "0", "4", "0", "0"],
    ["0x50", "BRA 0x90", "20", "4", "20", "0"],
    ["0x60", "WARPGROUP.DEPBAR.LE gsb0, 0x1", "8", "100", "0", "8"],
    ["0x70", "FMNMX R1, R2, R3, !PT", "0", "100", "0", "0"],
]


def write_page(path):
    lines = ['"Kernel Name","fwd_sm90_kernel"', ",".join(f'"{h}"' for h in HEADER)]
    lines += [",".join(f'"{c}"' for c in r) for r in ROWS]
    path.write_text("\n".join(lines) + "\n")


def test_waits_take_the_spin_and_the_held_instruction(tmp_path):
    page = tmp_path / "p.csv"
    write_page(page)
    data = list(sass_hotspots.rows(str(page)))
    total = sum(sass_hotspots.num(r["Warp Stall Sampling (All Samples)"]) for r in data)
    assert total == 100
    got = {addr: (round(share, 3), executed) for addr, share, executed, _ in sass_hotspots.waits(data, total)}
    # try-wait 2 + its spinning branch 40; depbar 0 + the branch held behind it 20; wgmma depbar 8
    assert got == {"0x10": (0.42, 100.0), "0x40": (0.2, 4.0), "0x60": (0.08, 100.0)}, got


def test_cli_prints_the_waits_table(tmp_path):
    page = tmp_path / "p.csv"
    write_page(page)
    r = subprocess.run([sys.executable, os.path.join(ROOT, "scripts", "sass_hotspots.py"), str(page), "--waits"],
                       capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    assert "waits (samples on the wait" in r.stdout
    assert "42.0%" in r.stdout and "TRYWAIT" in r.stdout
