"""tests/gpu/ncu_summary.py (the device check's ncu row) on Nsight Compute's raw CSV layout:
a header record, a units record, one record per kernel launch, ncu's own messages between."""

import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
SCRIPT = REPO / "tests" / "gpu" / "ncu_summary.py"
sys.path.insert(0, str(SCRIPT.parent))
import ncu_summary  # noqa: E402

HEADER = ('"ID","Process ID","Process Name","Host Name","Kernel Name","Context","Stream","Block Size",'
          '"Grid Size","Device","CC","gpu__compute_memory_throughput.avg.pct_of_peak_sustained_elapsed",'
          '"gpu__time_duration.sum","sm__throughput.avg.pct_of_peak_sustained_elapsed"')


def launch(i, name, ns, mem, sm):
    return (f'"{i}","4242","act-infer","127.0.0.1","{name}","1","13","(256, 1, 1)","(8, 3, 1)","0","9.0",'
            f'"{mem}","{ns}","{sm}"')


def write(tmp_path, units="nsecond", launches=()):
    lines = ["==PROF== Connected to process 4242 (/x/act-infer)", "act-infer bench: batch 1 ...", HEADER,
             f'"","","","","","","","","","","","%","{units}","%"']
    lines += [launch(i, *l) for i, l in enumerate(launches)]
    lines.append("==PROF== Disconnected from process 4242")
    p = tmp_path / "ncu.csv"
    p.write_text("\n".join(lines) + "\n")
    return p


def test_groups_by_function_with_time_weighted_throughput(tmp_path):
    p = write(tmp_path, launches=[
        ("void layernorm_residual<__nv_bfloat16>(LnArgs)", "1,000", "80", "20"),
        ("sm90_xmma_gemm_bf16bf16_bf16f32_f32_tn_n_tilesize128x64x64_warpgroupsize1x1x1_execute_"
         "segment_k_off_kernel__5x_cublas", "6,000", "50", "70"),
        ("void layernorm_residual<__nv_bfloat16>(LnArgs)", "3,000", "40", "60"),
        ("attention_short", "2,000", "10", "30"),
    ])
    line, top = ncu_summary.summarize(str(p), steps=2)
    # 12 us of kernels over 2 steps; the GEMM first (6 of 12 us), then layernorm (4), attention (2)
    assert line.startswith("2 kernels, 6.0 us of kernel time per step; "), line
    assert top[0].startswith("sm90_xmma_gemm_bf16bf16_bf16f32_f32_tn_n_tilesiz 50% (x1, sm 70%, mem 50%)"), top
    # layernorm: time-weighted sm (1*20 + 3*60)/4 = 50, mem (1*80 + 3*40)/4 = 50
    assert top[1] == "layernorm_residual 33% (x2, sm 50%, mem 50%)", top
    assert top[2] == "attention_short 17% (x1, sm 30%, mem 10%)", top


def test_units_record_scales_the_durations(tmp_path):
    p = write(tmp_path, units="usecond", launches=[("k", "3", "1", "2"), ("k", "5", "1", "2")])
    line, _ = ncu_summary.summarize(str(p), steps=1)
    assert line.startswith("2 kernels, 8.0 us of kernel time per step; k 100% (x2, sm 2%, mem 1%)"), line


def test_no_records_is_a_failure_naming_the_file(tmp_path):
    p = tmp_path / "ncu.csv"
    p.write_text("==PROF== Connected to process 1\n==ERROR== Failed to initialize the profiler: LibraryNotLoaded\n")
    r = subprocess.run([sys.executable, str(SCRIPT), str(p), "3"], capture_output=True, text=True)
    assert r.returncode == 1 and "no kernel records" in r.stderr and str(p) in r.stderr, r
    p = write(tmp_path, launches=[])
    r = subprocess.run([sys.executable, str(SCRIPT), str(p), "3"], capture_output=True, text=True)
    assert r.returncode == 1, r


def test_command_line_prints_the_row_then_the_top_list(tmp_path):
    p = write(tmp_path, launches=[(f"kern{i % 4}", str(1000 * (i + 1)), "10", "20") for i in range(8)])
    r = subprocess.run([sys.executable, str(SCRIPT), str(p), "2", "3"], capture_output=True, text=True)
    out = r.stdout.splitlines()
    assert r.returncode == 0 and len(out) == 4, r
    assert out[0].startswith("4 kernels, 18.0 us of kernel time per step; kern3 "), out
    assert all(o.startswith("  kern") for o in out[1:]), out
