"""bench/serve_load.py on a small CPU model: it runs every setting it is asked for, counts every
request, and reports consistent figures (the figures themselves are recorded, never asserted)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def test_serve_load_reports_every_setting(act_serve, ref, tmp_path):
    sys.path.insert(0, str(REPO / "tests" / "python"))
    import conftest

    cfg = conftest.small_cfg(image_size=40, vision_backbone={"input_shape": [3, 48, 48]})
    agent = ref.randomize_(ref.build_agent(cfg), 31)
    ref.save_checkpoint(agent, str(tmp_path / "ck.pt"), cfg, layout="model_state_dict", stats_in="state_dict",
                        prefix="", stats_path=str(tmp_path / "st.pkl"), config_path=str(tmp_path / "ck.yaml"),
                        include_config=False)
    model = tmp_path / "tiny.actw"
    subprocess.run([sys.executable, str(REPO / "tools" / "convert_checkpoint.py"), str(tmp_path / "ck.pt"), "-o",
                    str(model), "--config", str(tmp_path / "ck.yaml"), "--stats", str(tmp_path / "st.pkl")],
                   check=True, capture_output=True)
    out = tmp_path / "load.json"
    p = subprocess.run([sys.executable, str(REPO / "bench" / "serve_load.py"), "--model", str(model), "--act-serve",
                        str(act_serve), "--device", "cpu", "--clients", "1,3", "--requests", "2", "--transports", "tcp,shm",
                        "--json", str(out)],
                       capture_output=True, text=True, timeout=900)
    assert p.returncode == 0, p.stdout + p.stderr
    res = json.loads(out.read_text())
    rows = {(r["batching"], r["clients"], r["transport"]): r for r in res["rows"]}
    assert sorted(rows) == [(m, c, t) for m in ("off", "on") for c in (1, 3) for t in ("shm", "tcp")]
    for (mode, clients, _), r in rows.items():
        assert r["requests"] == 2 * clients
        assert 0 < r["infer_p50_ms"] <= r["rtt_p50_ms"] <= r["rtt_p99_ms"]
        assert r["throughput_rps"] > 0 and 1 <= r["mean_batch"] <= clients
        if mode == "off":
            assert r["mean_batch"] == 1
    assert set(res["summary"]) == {"speedup_batching_3_clients", "speedup_3_clients_vs_one_at_a_time",
                                   "overhead_p50_ms_batch1", "overhead_p50_ms_batch1_shm"}
    assert "batching  via clients" in p.stdout and p.stdout.count("\n") >= 9
