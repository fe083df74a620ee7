"""GPU placement without a GPU: torch's device count faked where the placement asks it; the
environment each run process gets and the GPU ids each run records."""

import json

import pytest
import torch

from fedpcd_app.analysis import runner, sweep
from fedpcd_app.runtime import placement
from fedpcd_app.server import gpus as server_gpus


@pytest.fixture
def fake_gpus(monkeypatch):
    """``fake_gpus(n)``: torch reports n CUDA devices (CUDA itself is never started)."""
    def fake(n: int) -> None:
        monkeypatch.setattr(torch.cuda, "is_available", lambda: n > 0)
        monkeypatch.setattr(torch.cuda, "device_count", lambda: n)
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    return fake


def test_visible_gpus_are_physical_ids(fake_gpus, monkeypatch):
    fake_gpus(0)
    assert server_gpus.visible_gpus() == []
    fake_gpus(4)
    assert server_gpus.visible_gpus() == ["0", "1", "2", "3"]
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "2,3,5,7")  # the process sees four: their physical ids
    assert server_gpus.visible_gpus() == ["2", "3", "5", "7"]
    fake_gpus(2)
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "6,1")
    assert server_gpus.visible_gpus() == ["6", "1"]
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "4,-1,5")  # CUDA stops at the first invalid entry
    assert server_gpus.visible_gpus() == ["4"]


def test_slots_one_gpu_each_and_shared_fractions():
    gpus = ["0", "1", "2", "3"]
    assert placement.slots(gpus, None, 1.0) == [("0",), ("1",), ("2",), ("3",)]
    assert placement.slots(gpus, None, 2.0) == [("0", "1"), ("2", "3")]
    # 0.5: two runs per GPU, filled GPU by GPU so that fewer jobs still use every GPU
    assert placement.slots(gpus, None, 0.5) == [("0",), ("1",), ("2",), ("3",)] * 2
    assert placement.slots(gpus, 3, 0.5) == [("0",), ("1",), ("2",)]
    assert placement.slots(["0"], None, 0.25) == [("0",)] * 4
    # default: the jobs spread over every GPU (more GPUs than jobs: several each)
    assert placement.slots(gpus, None, None) == [("0", "1", "2", "3")]
    assert placement.slots(gpus, 2, None) == [("0", "1"), ("2", "3")]
    assert placement.slots(gpus, 6, None) == [("0",), ("1",), ("2",), ("3",), ("0",), ("1",)]
    assert placement.slots([], 3, None) == [(), (), ()]


@pytest.mark.parametrize("gpus, jobs, per_run, message", [
    (["0", "1"], 3, 1.0, "--jobs 3 with --gpus-per-run 1 on 2 GPU\\(s\\): at most 2 runs at once"),
    (["0", "1"], None, 4.0, "only 2 GPU\\(s\\) visible"),
    ([], None, 1.0, "torch sees no GPU here; drop --gpus-per-run"),
])
def test_slots_refuse_what_the_machine_cannot_give(gpus, jobs, per_run, message):
    with pytest.raises(placement.PlacementError, match=message):
        placement.slots(gpus, jobs, per_run)


@pytest.mark.parametrize("text, message", [
    ("0.3", "share 1/k"), ("1.5", "whole number"), ("0", "must be > 0"), ("x", "give a number"),
])
def test_gpus_per_run_values(text, message):
    assert placement.parse_gpus_per_run("0.5") == 0.5 and placement.parse_gpus_per_run("2") == 2.0
    assert placement.parse_gpus_per_run(None) is None
    with pytest.raises(placement.PlacementError, match=message):
        placement.parse_gpus_per_run(text)


def test_child_env_sets_only_the_slot_gpus():
    base = {"PATH": "/bin", "CUDA_VISIBLE_DEVICES": "0,1,2,3"}
    assert placement.child_env(("2",), base) == {"PATH": "/bin", "CUDA_VISIBLE_DEVICES": "2"}
    assert placement.child_env(("1", "3"), base)["CUDA_VISIBLE_DEVICES"] == "1,3"
    assert placement.child_env((), {"PATH": "/bin"}) == {"PATH": "/bin"}  # no GPU: untouched
    assert base["CUDA_VISIBLE_DEVICES"] == "0,1,2,3"


def test_simulate_gpus_selects_before_cuda_starts(fake_gpus, monkeypatch):
    env = {}
    monkeypatch.setattr(torch.cuda, "is_initialized", lambda: False)
    fake_gpus(2)  # what the driver would report once CUDA_VISIBLE_DEVICES=3,1 is set
    assert placement.select("3,1", env) == ["3", "1"] and env == {"CUDA_VISIBLE_DEVICES": "3,1"}
    assert server_gpus.visible_gpus(env) == ["3", "1"]  # what the run records
    with pytest.raises(placement.PlacementError, match="are not in CUDA_VISIBLE_DEVICES='3,1'"):
        placement.select("0", env)
    fake_gpus(1)  # an id the driver does not know: CUDA stops there
    with pytest.raises(placement.PlacementError, match="torch sees 1 of these 2 GPU"):
        placement.select("0,9", {})
    with pytest.raises(placement.PlacementError, match="distinct GPU ids"):
        placement.select("0,0", {})
    monkeypatch.setattr(torch.cuda, "is_initialized", lambda: True)
    with pytest.raises(placement.PlacementError, match="already initialised"):
        placement.select("0", {})


def test_simulate_cli_bad_gpus_is_one_line(capsys, fake_gpus):
    from fedpcd_app.runtime import simulate

    fake_gpus(0)
    assert simulate.main(["--gpus", "0,,1", "--run-config", "num-server-rounds=1"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: --gpus '0,,1'") and err.count("\n") == 1


class _RecordingProcess:
    """Stands in for a run process: records the environment it was given and the run it got,
    and writes the run's summary (the dispatch is tested, not the run)."""

    made: list = []

    def __init__(self, env, gpus=(), reuse=True):
        self.env, self.gpus, self.runs = env, tuple(gpus), []
        _RecordingProcess.made.append(self)

    def run(self, overrides, folder, engine=None):
        self.runs.append(str(folder))
        recorded = json.loads((folder / sweep.RUN_FILE).read_text())["gpus"]
        (folder / "summary.json").write_text(json.dumps({"gpus": recorded, "seed": overrides["seed"]}))
        return str(folder)

    def close(self):
        pass

    def kill(self):
        pass


def test_sweep_spreads_runs_over_the_gpus_and_records_them(fake_gpus, monkeypatch, tmp_path):
    fake_gpus(2)
    _RecordingProcess.made = []
    monkeypatch.setattr(runner, "RunProcess", _RecordingProcess)
    s = sweep.parse_sweep({"name": "p", "seeds": list(range(8)), "methods": [{"name": "fedavg", "method": "fedavg"}]})
    failures = sweep.run_sweep(s, tmp_path, jobs=None, gpus_per_run=0.5, progress=False, engine={"workers": 0})
    assert failures == []
    procs = _RecordingProcess.made
    # 2 GPUs × 2 runs per GPU: four run processes, each seeing only its GPU
    assert sorted(p.env["CUDA_VISIBLE_DEVICES"] for p in procs) == ["0", "0", "1", "1"]
    assert sorted(p.gpus for p in procs) == [("0",), ("0",), ("1",), ("1",)]
    assert sum(len(p.runs) for p in procs) == 8
    for p in procs:  # each run records the GPUs of the process it ran in
        for folder in p.runs:
            labels = json.loads((tmp_path / folder / sweep.RUN_FILE).read_text())
            assert labels["gpus"] == [p.env["CUDA_VISIBLE_DEVICES"]] == list(p.gpus)
            assert labels["overrides"]["seed"] == labels["seed"]
    fake_gpus(0)  # no GPU: the environment is left as it is, nothing recorded
    _RecordingProcess.made = []
    s = sweep.parse_sweep({"name": "q", "seeds": [0, 1], "methods": [{"name": "fedavg", "method": "fedavg"}]})
    assert sweep.run_sweep(s, tmp_path / "cpu", jobs=2, progress=False, engine={"workers": 0}) == []
    assert [("CUDA_VISIBLE_DEVICES" in p.env, p.gpus) for p in _RecordingProcess.made] == [(False, ())] * 2
    assert json.loads((s.runs[0].folder(tmp_path / "cpu") / sweep.RUN_FILE).read_text())["gpus"] == []


def test_sweep_cli_refuses_more_jobs_than_the_gpus_hold(fake_gpus, capsys, tmp_path):
    fake_gpus(1)
    f = tmp_path / "s.toml"
    f.write_text('name = "s"\nseeds = [0]\n[[methods]]\nname = "a"\nmethod = "fedavg"\n')
    assert sweep.main([str(f), "--out", str(tmp_path / "o"), "--jobs", "3", "--gpus-per-run", "0.5"]) == 2
    err = capsys.readouterr().err
    assert "at most 2 runs at once" in err and err.count("\n") == 1
    assert not (tmp_path / "o").exists()


def test_runs_sharing_their_data_go_out_together(fake_gpus, monkeypatch, tmp_path):
    fake_gpus(0)
    _RecordingProcess.made = []
    monkeypatch.setattr(runner, "RunProcess", _RecordingProcess)
    s = sweep.parse_sweep({"name": "o", "seeds": [0, 1],
                           "settings": [{"name": "a", "dirichlet-alpha": 0.1}, {"name": "b", "dirichlet-alpha": 1.0}],
                           "methods": [{"name": "fedavg", "method": "fedavg"},
                                       {"name": "prox", "method": "fedprox", "lr": [0.1, 0.2]}]})
    assert sweep.run_sweep(s, tmp_path, jobs=1, progress=False, engine={"workers": 0}) == []
    (proc,) = _RecordingProcess.made
    order = [tuple(str((tmp_path / f).relative_to(tmp_path)).split("/")) for f in proc.runs]
    # one process: setting by setting, seed by seed (each seed's data is built once), methods in file order
    assert [(o[0], o[3]) for o in order] == [("a", "seed0")] * 3 + [("a", "seed1")] * 3 + \
        [("b", "seed0")] * 3 + [("b", "seed1")] * 3
    assert [o[1:3] for o in order[:3]] == [("fedavg", "base"), ("prox", "lr=0.1"), ("prox", "lr=0.2")]
