"""scripts/sass_loops.py on a fabricated disassembly: wgmma loops found by their backward branch,
counted by opcode, other loops and other functions left out."""
import os
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(ROOT, "scripts"))

import sass_loops  # noqa: E402

DUMP = """
	.section	.text._Z6kernelv,"ax",@progbits
.text._Z6kernelv:
        /*0000*/                   MOV R1, c[0x0][0x28] ;
.L_x_1:
        /*0010*/                   FADD R2, R2, R3 ;
        /*0020*/              @!P0 BRA `(.L_x_1) ;
.L_x_2:
        /*0030*/                   WARPGROUP.ARRIVE ;
        /*0040*/                   HGMMA.64x128x16.F32.BF16 R24, gdesc[UR16], RZ, !UPT ;
        /*0050*/                   HGMMA.64x128x16.F32.BF16 R24, gdesc[UR20], R24, gsb0 ;
        /*0060*/                   WARPGROUP.DEPBAR.LE gsb0, 0x0 ;
        /*0070*/                   FMNMX R4, R24, R25, !PT ;
        /*0080*/                   MUFU.EX2 R5, R4 ;
        /*0090*/                   MUFU.EX2 R6, R4 ;
        /*00a0*/               @P1 BRA `(.L_x_2) ;
        /*00b0*/                   EXIT ;
	.section	.text._Z5otherv,"ax",@progbits
.text._Z5otherv:
        /*0000*/                   EXIT ;
"""


def test_finds_the_wgmma_loop_only():
    funcs, labels = sass_loops.functions(DUMP)
    assert set(funcs) == {"_Z6kernelv", "_Z5otherv"}
    found = sass_loops.loops("_Z6kernelv", funcs["_Z6kernelv"], labels)
    assert [(start, end) for start, end, _ in found] == [(0x30, 0xA0)]
    ins = [i for _, i in found[0][2]]
    assert sass_loops.counts(ins, 3).startswith("HGMMA.64x128x16.F32.BF16 2, MUFU.EX2 2")
    assert sass_loops.opcode("@!P0 BRA `(.L_x_1)") == "BRA"


def test_command_line_on_a_dump(tmp_path):
    dump = tmp_path / "k.sass"
    dump.write_text(DUMP)
    script = os.path.join(ROOT, "scripts", "sass_loops.py")
    r = subprocess.run([sys.executable, script, str(dump), "kernel", "--timeline"], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    assert "loop 0x30-0xa0: 8 instructions, 2 HGMMA" in r.stdout
    assert "[3: FMNMX 1, MUFU.EX2 2]" in r.stdout or "[3: MUFU.EX2 2, FMNMX 1]" in r.stdout
    missing = subprocess.run([sys.executable, script, str(dump), "nothing"], capture_output=True, text=True)
    assert missing.returncode != 0 and "no function matches" in missing.stderr
