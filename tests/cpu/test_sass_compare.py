"""scripts/sass_compare.py on fabricated disassemblies: equal and different functions, the
anonymous namespaces made alike (--anon) and a candidate config read under its production name
(--rename)."""
import os
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(ROOT, "scripts"))

import sass_compare  # noqa: E402

KERNEL = "_ZN9flashback4sm9015fwd_sm90_kernelINS0_13FwdSm90TraitsIL_ZNS0_{cfg}EELNS_6hopper5DtypeE0EEEEEvv"
ANON_A = "_ZN9flashback4sm9012_GLOBAL__N__1a2b3c4d_7_fwd_sm90_cu_5e6f7a8b14helperEv"
ANON_B = "_ZN9flashback4sm9012_GLOBAL__N__9f8e7d6c_7_fwd_sm90_cu_0a1b2c3d14helperEv"


def dump(functions):
    """A cuobjdump -sass like text of {name: [instruction, ...]}."""
    out = []
    for name, body in functions.items():
        out.append(f"\t\tFunction : {name}")
        out += [f"        /*{16 * i:04x}*/                   {ins} ;" for i, ins in enumerate(body)]
    return "\n".join(out) + "\n"


def run(tmp_path, a, b, *args):
    pa, pb = tmp_path / "a.sass", tmp_path / "b.sass"
    pa.write_text(dump(a))
    pb.write_text(dump(b))
    res = subprocess.run([sys.executable, os.path.join(ROOT, "scripts", "sass_compare.py"), str(pa), str(pb),
                          *args], capture_output=True, text=True)
    return res.returncode, res.stdout.strip().splitlines()[-1]


def test_same_and_differ(tmp_path):
    body = ["MOV R1, c[0x0][0x28]", "EXIT"]
    k = KERNEL.format(cfg="14kFwdSm90Hdim64")
    assert run(tmp_path, {k: body}, {k: body}) == (0, "same 1, differ 0, only in A: 0, only in B: 0")
    assert run(tmp_path, {k: body}, {k: body[:1]}) == (1, "same 0, differ 1, only in A: 0, only in B: 0")


def test_anonymous_namespaces_alike(tmp_path):
    body = ["EXIT"]
    assert run(tmp_path, {ANON_A: body}, {ANON_B: body})[1] == "same 0, differ 0, only in A: 1, only in B: 1"
    assert run(tmp_path, {ANON_A: body}, {ANON_B: body}, "--anon") == (
        0, "same 1, differ 0, only in A: 0, only in B: 0")


def test_rename_reads_a_candidate_under_its_production_name(tmp_path):
    body = ["HGMMA.64x128x16.F32.BF16 R24, gdesc[UR16], RZ, !UPT", "EXIT"]
    cand = KERNEL.format(cfg="21kFwdSm90Hdim64TmaTail")
    prod = KERNEL.format(cfg="19kFwdSm90Hdim64Multi")
    main = KERNEL.format(cfg="14kFwdSm90Hdim64")
    a, b = {cand: body}, {prod: body, main: ["EXIT"]}
    assert run(tmp_path, a, b, "--rename", "kFwdSm90Hdim64TmaTail=kFwdSm90Hdim64Multi",
               "--filter", "Multi") == (0, "same 1, differ 0, only in A: 0, only in B: 0")
    # The length prefix bounds the name: renaming kFwdSm90Hdim64 leaves ...Hdim64Multi alone.
    assert sass_compare.normalize(prod, renames=[("kFwdSm90Hdim64", "kX")]) == prod
    assert sass_compare.normalize(main, renames=[("kFwdSm90Hdim64", "kX")]) == KERNEL.format(cfg="2kX")


def test_rename_needs_old_and_new(tmp_path):
    k = KERNEL.format(cfg="14kFwdSm90Hdim64")
    (tmp_path / "a.sass").write_text(dump({k: ["EXIT"]}))
    res = subprocess.run([sys.executable, os.path.join(ROOT, "scripts", "sass_compare.py"),
                          str(tmp_path / "a.sass"), str(tmp_path / "a.sass"), "--rename", "kOnly"],
                         capture_output=True, text=True)
    assert res.returncode == 2 and "OLD=NEW" in res.stderr


def test_loop_counts_reorders_not_renumbering(tmp_path):
    """--loop: a register renumbering inside the HGMMA span counts nothing, a reordering counts,
    and a change outside the span (the prologue) leaves the loop's count at 0."""
    k = KERNEL.format(cfg="14kFwdSm90Hdim64")
    loop = ["HGMMA.64x64x16.F32.BF16 R24, gdesc[UR8], RZ, !UPT", "MUFU.EX2 R3, R3", "FFMA R4, R5, R6, -R7",
            "HGMMA.64x64x16.F32.BF16 R24, gdesc[UR8], R24"]
    base = ["MOV R1, c[0x0][0x28]"] + loop + ["EXIT"]
    renumbered = ["MOV R1, c[0x0][0x28]"] + [ins.replace("R3", "R9").replace("UR8", "UR12") for ins in loop] + ["EXIT"]
    reordered = ["MOV R1, c[0x0][0x28]", loop[0], loop[2], loop[1], loop[3], "EXIT"]
    prologue = ["MOV R2, c[0x0][0x30]"] + base
    last = lambda b: run(tmp_path, {k: base}, {k: b}, "--loop")
    import re as _re
    text = lambda b: subprocess.run([sys.executable, os.path.join(ROOT, "scripts", "sass_compare.py"),
                                     str(tmp_path / "a.sass"), str(tmp_path / "b.sass"), "--loop"],
                                    capture_output=True, text=True).stdout
    assert last(renumbered)[0] == 1 and "main loop: 0 of 4 lines differ" in text(renumbered)
    assert last(reordered)[0] == 1 and _re.search(r"main loop: [1-9][0-9]* of 4 lines differ", text(reordered))
    assert last(prologue)[0] == 1 and "main loop: 0 of 4 lines differ" in text(prologue)
    assert sass_compare.loop_lines(["EXIT"]) == []
