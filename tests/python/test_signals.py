"""act-infer under signals and failing writes: a stopped run leaves every output whole or absent,
says what it did not write, and exits with a status that tells a supervisor what happened.

Steps are slowed with the CPU timing model (ACT_CPU_TIMING_MODEL: every step a busy wait that
outputs zeros), so that a signal reliably lands mid-run."""
from __future__ import annotations

import os
import resource
import signal
import subprocess
import time
from pathlib import Path

import numpy as np
import pytest

from conftest import default_signals, episode_for

SLOW = "300000"   # us per step


@pytest.fixture(scope="module")
def setup(tmp_path_factory, make_cfg, make_model, act_infer, hdf5):
    d = tmp_path_factory.mktemp("signals")
    cfg = make_cfg()
    actw, _ = make_model(d, cfg, 31)
    eps = d / "episodes"
    eps.mkdir()
    for i in range(3):
        episode_for(cfg, eps / f"episode_{i}.hdf5", 4, seed=300 + i)
    return {"actw": actw, "eps": eps, "long": episode_for(cfg, d / "long.hdf5", 40, seed=399)}


def _start(act_infer, *args):
    env = dict(os.environ, ACT_CPU_TIMING_MODEL=SLOW)
    return subprocess.Popen([str(act_infer), *map(str, args)], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, env=env, preexec_fn=default_signals)


def _wait_for(pred, proc, what, timeout=60):
    deadline = time.monotonic() + timeout
    while not pred():
        assert proc.poll() is None, f"exited {proc.returncode} before {what}:\n{proc.communicate()[1]}"
        assert time.monotonic() < deadline, f"no {what} in {timeout} s"
        time.sleep(0.02)


def _temps(folder: Path):
    return sorted(p.name for p in folder.iterdir() if ".tmp." in p.name)


def test_eval_stops_after_the_step_in_flight_and_says_what_is_an_earlier_runs(setup, act_infer, tmp_path):
    """The first SIGTERM: the step in flight finishes, the episode in flight's unfinished file is
    removed, the stop names the episodes not evaluated whose files are an earlier run's, and the
    summary there is said to be an earlier run's; exit 128 + 15."""
    preds = tmp_path / "preds"
    preds.mkdir()
    old = np.full((1, 2, 3), 7, np.float32)
    for i in range(3):
        np.save(preds / f"episode_{i}.npy", old)
    summary = tmp_path / "s.json"
    summary.write_text('{"earlier": true}\n')
    p = _start(act_infer, "eval", "--model", setup["actw"], "--episodes", setup["eps"], "--device", "cpu",
               "--batch", 1, "--json", summary, "--save-predictions", preds)
    _wait_for(lambda: any(n.startswith("episode_1.npy.tmp.") for n in _temps(preds)), p, "episode_1 in flight")
    p.send_signal(signal.SIGTERM)
    _, err = p.communicate(timeout=60)
    assert p.returncode == 128 + signal.SIGTERM, err
    assert "stopped by SIGTERM after 1 of 3 episodes" in err, err
    assert "2 episodes not evaluated; 2 of them still have an earlier run's predictions" in err, err
    assert f"{summary} not written: the file there is an earlier run's summary" in err, err
    assert _temps(preds) == [], "an unfinished predictions file was left behind"
    assert summary.read_text() == '{"earlier": true}\n'
    assert not np.array_equal(np.load(preds / "episode_0.npy"), old), "episode_0 was evaluated"
    for i in (1, 2):
        assert np.array_equal(np.load(preds / f"episode_{i}.npy"), old)


def test_a_second_signal_stops_eval_at_once_without_leftovers(setup, act_infer, tmp_path):
    preds = tmp_path / "preds"
    p = _start(act_infer, "eval", "--model", setup["actw"], "--episodes", setup["eps"], "--device", "cpu",
               "--batch", 1, "--save-predictions", preds)
    _wait_for(lambda: preds.exists() and _temps(preds), p, "a predictions file in flight")
    p.send_signal(signal.SIGINT)
    time.sleep(0.03)
    p.send_signal(signal.SIGINT)
    _, err = p.communicate(timeout=60)
    assert p.returncode == -signal.SIGINT, (p.returncode, err)
    assert _temps(preds) == []


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGHUP])
def test_predict_dies_of_a_signal_without_leaving_a_temporary_file(setup, act_infer, tmp_path, sig):
    out = tmp_path / "pred.npy"
    p = _start(act_infer, "predict", "--model", setup["actw"], "--episode", setup["long"], "--device", "cpu",
               "--batch", 1, "--out", out)
    _wait_for(lambda: _temps(tmp_path), p, "the output in flight")
    p.send_signal(sig)
    _, err = p.communicate(timeout=60)
    assert p.returncode == -sig, (p.returncode, err)
    assert list(tmp_path.iterdir()) == [], sorted(x.name for x in tmp_path.iterdir())


def test_a_failed_write_to_the_standard_output_is_a_failure(setup, act_infer):
    """info --json > FILE on a full disk (or past ulimit -f) must not exit 0 with FILE cut short."""
    with open("/dev/full", "w") as full:
        for args in (["info", "--model", setup["actw"], "--json"], ["--help"]):
            p = subprocess.run([str(act_infer), *map(str, args)], stdout=full, stderr=subprocess.PIPE, text=True,
                               timeout=60)
            assert p.returncode == 1 and "writing the standard output failed: No space left on device" in p.stderr, \
                (args, p.returncode, p.stderr)


def test_a_file_size_limit_fails_the_write_instead_of_killing(setup, act_infer, tmp_path):
    """ulimit -f: SIGXFSZ is ignored, so the write fails (EFBIG) and the output's error path runs."""
    out = tmp_path / "pred.npy"

    def small_files():
        resource.setrlimit(resource.RLIMIT_FSIZE, (2048, 2048))

    p = subprocess.run([str(act_infer), "predict", "--model", str(setup["actw"]), "--episode", str(setup["long"]),
                        "--device", "cpu", "--out", str(out)], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                       text=True, timeout=300, preexec_fn=small_files)
    assert p.returncode == 1 and "File too large" in p.stderr, (p.returncode, p.stderr)
    assert list(tmp_path.iterdir()) == []


def test_a_load_that_runs_out_of_address_space_exits(setup, act_infer):
    """Under ulimit -v too small for the model, the load fails and the process exits with 1: it
    used to print the error and then hang in OpenBLAS's exit handler, which joined a worker that
    was retrying its failed allocation forever."""
    def tight():
        resource.setrlimit(resource.RLIMIT_AS, (200_000 * 1024, 200_000 * 1024))

    p = subprocess.run([str(act_infer), "predict", "--model", str(setup["actw"]), "--episode", str(setup["long"]),
                        "--device", "cpu", "--out", "/dev/null"], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                       text=True, timeout=60, preexec_fn=tight)
    assert p.returncode == 1 and ("out of memory" in p.stderr or "cannot allocate" in p.stderr), \
        (p.returncode, p.stderr)


def test_a_signal_ignored_at_start_stays_ignored(setup, act_infer, tmp_path):
    """nohup act-infer ...: SIGHUP was ignored when act-infer started and must stay so."""
    out = tmp_path / "pred.npy"
    p = subprocess.Popen([str(act_infer), "predict", "--model", str(setup["actw"]), "--episode", str(setup["long"]),
                          "--device", "cpu", "--batch", "8", "--out", str(out)],
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                         env=dict(os.environ, ACT_CPU_TIMING_MODEL=SLOW),
                         preexec_fn=lambda: (default_signals(), signal.signal(signal.SIGHUP, signal.SIG_IGN)))
    _wait_for(lambda: _temps(tmp_path), p, "the output in flight")
    p.send_signal(signal.SIGHUP)
    _, err = p.communicate(timeout=120)
    assert p.returncode == 0 and out.exists(), (p.returncode, err)


def test_a_reader_gone_mid_run_leaves_no_temporary_file(setup, act_infer, tmp_path):
    """SIGPIPE (stderr's reader gone before predict's last message): the process dies of it as
    before, without leaving PATH.tmp.PID."""
    out = tmp_path / "pred.npy"
    r, w = os.pipe()
    p = subprocess.Popen([str(act_infer), "predict", "--model", str(setup["actw"]), "--episode", str(setup["long"]),
                          "--device", "cpu", "--batch", "8", "--out", str(out)],
                         stdout=subprocess.DEVNULL, stderr=w, env=dict(os.environ, ACT_CPU_TIMING_MODEL=SLOW))
    os.close(w)
    _wait_for(lambda: _temps(tmp_path), p, "the output in flight")
    os.close(r)
    assert p.wait(timeout=120) == -signal.SIGPIPE
    assert list(tmp_path.iterdir()) == []


def test_a_signal_during_plots_reaches_the_plotting_program(setup, act_infer, tmp_path):
    """The signal comes while --plots' program runs: it gets the signal too, eval waits for it,
    says every episode was evaluated and written, and exits 128 + the signal."""
    fake = tmp_path / "plots.sh"
    fake.write_text("#!/bin/sh\necho plotting >&2\nexec sleep 60\n")
    fake.chmod(0o755)
    summary = tmp_path / "s.json"
    p = subprocess.Popen([str(act_infer), "eval", "--model", str(setup["actw"]), "--episodes", str(setup["eps"]),
                          "--device", "cpu", "--json", str(summary), "--plots", str(tmp_path / "plots")],
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                         env=dict(os.environ, ACT_PYTHON=str(fake)), preexec_fn=default_signals)
    _wait_for(summary.exists, p, "the summary")
    time.sleep(0.5)   # the plots program started
    t0 = time.monotonic()
    p.send_signal(signal.SIGTERM)
    _, err = p.communicate(timeout=60)
    assert time.monotonic() - t0 < 10, "eval waited out the plots program"
    assert p.returncode == 128 + signal.SIGTERM, err
    assert "SIGTERM came after the last step: every episode was evaluated and its outputs written" in err, err
