"""The fast FedAvg path equals the matrix path bit for bit; the benchmarks' outputs hold
their contract (fields, cache sizes, memory arithmetic). No timings are asserted."""

import json

import numpy as np
import pytest
import torch

import strategies.fedavg as fedavg
from benchmarks import aggregation, cache_memory
from fedcore import flat
from fedcore.config import load_config
from strategies import registry
from tests.helpers import arrays_from_flat, method_step, tiny_template, train_reply


def _replies(m: int, seed: int = 0):
    template = tiny_template()
    d = flat.spec_of(template).dim
    rng = np.random.default_rng(seed)
    theta = rng.normal(size=d)
    replies = [train_reply(arrays_from_flat(theta + rng.normal(size=d), template), pid,
                           num_examples=int(rng.integers(5, 80))) for pid in range(m)]
    return template, theta, replies


def _matrix_path(strat, server_round, replies):
    """FedAvg as it was computed before the streaming sum: (m, d) matrix, then a gemv."""
    round_ = strat.read_round(server_round, replies, strat.context)
    theta = round_.theta
    eta_l = strat.round_lr(server_round)
    eta_g = strat.server_lr or eta_l
    g_bar = torch.sub(theta, fedavg.fedavg_direction(round_.model_matrix, round_.fedavg_weights))
    return theta - (eta_g / eta_l) * g_bar, float(g_bar.norm())


@pytest.mark.parametrize("block", [3, 7, 40, 1 << 22])
@pytest.mark.parametrize("m", [1, 4, 11])
def test_weighted_sum_equals_matrix_product_bitwise(monkeypatch, block, m):
    # Prepare: blocks (of m x columns elements) smaller than, straddling and larger than the arrays
    monkeypatch.setattr(flat, "BLOCK_ELEMS", block)
    _, _, replies = _replies(m, seed=m)
    records = [r.content["arrays"] for r in replies]
    w = torch.rand(m, dtype=torch.float64)
    w = w / w.sum()
    # Execute
    fast = flat.weighted_sum(records, w)
    # Assert: identical float32 values, not merely close
    assert torch.equal(fast, fedavg.fedavg_direction(flat.records_to_matrix(records), w))


@pytest.mark.parametrize("server_lr", [0.0, 0.3])
def test_fedavg_strategy_identical_to_matrix_path(monkeypatch, server_lr):
    monkeypatch.setattr(flat, "BLOCK_ELEMS", 13)
    template, theta, replies = _replies(6)
    strat = registry.build(load_config({"method": "fedavg", "lr": 0.1, "server-lr": server_lr}))
    for rnd in (1, 2):  # the second round starts from the first round's output
        strat.set_model(arrays_from_flat(theta, template))
        expected, norm = _matrix_path(strat, rnd, replies)
        step, _ = method_step(strat, rnd, replies)
        assert torch.equal(step.model, expected)
        assert step.metrics["update-norm"] == norm
        theta = step.model.numpy()


def test_weighted_sum_rejects_mismatched_reply():
    template, theta, replies = _replies(2)
    short = train_reply(arrays_from_flat(theta[:-1], _truncated(template)), 9, num_examples=3)
    with pytest.raises(ValueError, match="reply 2 has arrays of sizes"):
        flat.weighted_sum([r.content["arrays"] for r in [*replies, short]], torch.ones(3) / 3)


def _truncated(template):
    from flwr.app import Array, ArrayRecord

    items = list(template.items())
    last_key, last = items[-1]
    arr = last.numpy().reshape(-1)[:-1]
    return ArrayRecord({**dict(items[:-1]), last_key: Array(arr)})


def test_aggregation_json_contract(capsys):
    # Execute: three methods, tiny model, 4 rounds (FedPCD's cache fills with the 6 clients)
    assert aggregation.main(["--methods", "fedavg,fedpcd,federage", "--sizes", "mlp", "--replies", "3",
                             "--clients", "6", "--rounds", "4", "--timed", "2", "--json"]) == 0
    rows = [json.loads(line) for line in capsys.readouterr().out.splitlines() if line.startswith("{")]
    # Assert: the contract fields, the ratio's definition and the reported cache sizes
    assert [r["strategy"] for r in rows] == ["fedavg", "fedpcd", "federage"]  # federage: needs its beta metric
    for r in rows:
        assert {"strategy", "params", "replies", "cache", "seconds", "fedavg_seconds", "ratio",
                "floor_seconds", "floor_ratio", "device"} <= set(r)
        assert r["replies"] == 3 and r["params"] > 0 and r["device"] == "cpu"
        assert r["ratio"] == pytest.approx(r["seconds"] / r["fedavg_seconds"])
    assert rows[0]["cache"] == 0 and 3 <= rows[1]["cache"] <= 6
    # FedPCD has a floor, timed in the same rounds; FedAvg and FedeRage have none
    pcd = rows[1]
    assert rows[0]["floor_ratio"] is None and rows[2]["floor_seconds"] is None
    assert set(pcd["floor_parts"]) == {"pass", "gram_rows", "result"}  # no active constraint: no direction part
    assert len(pcd["floor_ratios"]) == len(pcd["seconds_all"]) == 2
    assert pcd["floor_ratio"] == pytest.approx(float(np.median(pcd["floor_ratios"])))


def test_craft_floor_parts_and_the_check(capsys):
    assert aggregation.main(["--methods", "craft", "--sizes", "mlp", "--replies", "3", "--clients", "6",
                             "--rounds", "2", "--timed", "1", "--json", "--check"]) == 0  # --check: ResNet-18 only
    (row,) = [json.loads(line) for line in capsys.readouterr().out.splitlines() if line.startswith("{")]
    assert set(row["floor_parts"]) == {"pass", "gram", "direction", "result"}
    assert row["floor_seconds"] == pytest.approx(sum(row["floor_parts"].values()))  # one timed round
    assert row["floor_ratio"] == pytest.approx(row["seconds"] / row["floor_seconds"])


def test_check_flags_fedpcd_and_craft_above_the_limit_at_resnet18_only():
    rows = [{"strategy": "fedpcd", "size": "resnet18", "floor_ratio": 1.3},
            {"strategy": "craft", "size": "resnet18", "floor_ratio": 1.1},
            {"strategy": "craft", "size": "cnn", "floor_ratio": 5.0},
            {"strategy": "fedavg", "size": "resnet18", "floor_ratio": None}]
    assert aggregation.check(rows, 1.2) == ["fedpcd at resnet18: floor_ratio 1.30 > 1.2"]
    assert aggregation.check(rows, 1.05) == ["fedpcd at resnet18: floor_ratio 1.30 > 1.05",
                                             "craft at resnet18: floor_ratio 1.10 > 1.05"]


def test_cache_memory_row_counts_entries_and_halves_with_16_bit():
    # Prepare / Execute: 3 rounds of 4 distinct clients at the MLP size
    f32 = cache_memory.memory_row("float32", "mlp", entries=12, replies=4, seed=0)
    bf16 = cache_memory.memory_row("bfloat16", "mlp", entries=12, replies=4, seed=0)
    # Assert: exactly 12 entries of d values, 4 or 2 bytes each
    assert f32["entries"] == bf16["entries"] == 12
    assert f32["entries_mb"] == pytest.approx(12 * f32["params"] * 4 / 2**20)
    assert bf16["entries_mb"] == pytest.approx(f32["entries_mb"] / 2)
    assert f32["peak_rss_mb"] >= f32["rss_before_mb"] > 0
    # the store holds exactly the 12 entries' rows (reserved rows grow as a view: no headroom)
    assert f32["store_mb"] == pytest.approx(f32["entries_mb"]) and f32["capacity"] == 12
    assert f32["strategy_peak_mb"] == pytest.approx(f32["peak_rss_mb"] - f32["rss_before_mb"])
    assert f32["strategy_peak_x_store"] == pytest.approx(f32["strategy_peak_mb"] / f32["store_mb"])


def test_real_update_accuracy_rows():
    rows = cache_memory.real_updates_rows(rounds=3, model="mlp", seed=0)
    assert [r["round"] for r in rows] == [1, 2, 3]
    assert rows[-1]["constraints"] >= rows[0]["constraints"] > 0
    for r in rows:
        for dt in ("bfloat16", "float16"):
            # 16-bit storage perturbs d_t by about the storage's rounding, never by O(1)
            assert 0.0 <= r[f"d_rel_{dt}"] < 0.05
            assert np.isfinite(r[f"mu_rel_{dt}"])


@pytest.mark.slow
def test_simulation_benchmark_floor_replays_the_app(tmp_path):
    """benchmarks/simulation.py: the app's rounds on the local engine and the floor's replay do
    the same training (train losses agree to float rounding), and it reports ratios."""
    from benchmarks import simulation

    out = tmp_path / "sim.json"
    assert simulation.main(["--settings", "digits", "--engines", "local", "--no-e2e", "--rounds", "4",
                            "--eval-every", "3", "--floor-repeats", "1", "--json", str(out)]) == 0
    (res,) = json.loads(out.read_text())["results"]
    assert (res["setting"], res["engine"]) == ("digits", "local") and len(res["rows"]) == 4
    assert res["max_train_loss_diff"] < 1e-5  # the floor trained the same clients on the same batches
    assert res["no_eval"]["ratio"] > 0 and res["with_eval"]["ratio"] > 0
    assert res["eval_round_cost"]["app_s"] is not None
    assert "local training" in res["breakdown_s"]


def test_simulation_benchmark_vectorised_engine_rows_have_the_contract_fields():
    """--engines vectorised: rows with "engine": "vectorised", the setting, no_eval.ratio and
    max_train_loss_diff as the other engines' rows (the local engine with client-execution =
    'vectorised'; local and ray run the loop)."""
    import argparse

    from benchmarks import simulation

    assert simulation.EXECUTION == {"local": "loop", "ray": "loop", "vectorised": "vectorised", "default": "auto"}
    rounds = [{"round": r, "round_seconds": 0.2, "train_seconds": 0.2, "train_loss": 1.0 / r,
               **({"eval": {"eval_seconds": 0.1}} if r % 3 == 0 else {})} for r in range(1, 7)]
    floor = [{"round": r, "work": 0.1, "eval": 0.05 if r % 3 == 0 else 0.0, "model_gap": 0.0,
              "train_loss": 1.0 / r + 1e-8} for r in range(1, 7)]
    args = argparse.Namespace(rounds=6, eval_every=3, workers=0, num_cpus=1.0, ray_num_gpus=0.0)
    row = simulation.engine_result("digits", "vectorised", rounds, 3.0, floor, {}, args)
    assert row["engine"] == "vectorised" and row["setting"] == "digits"
    assert row["client_execution"] == "vectorised" and row["engine_label"] == "vectorised (in-process)"
    assert row["no_eval"]["ratio"] == pytest.approx(2.0) and row["max_train_loss_diff"] == pytest.approx(1e-8)
    with pytest.raises(SystemExit):
        simulation.main(["--engines", "vectorised,fast"])


def test_training_only_trains_the_same_jobs_both_ways_on_reused_model_objects():
    """--training-only: the loop and the rows train the same jobs (same losses within float
    tolerance); every pass starts from the same weights on the same model objects (as the
    ClientApp reuses its models), so repeats do not drift."""
    from benchmarks import simulation

    res = simulation.training_only("logreg", clients=4, examples=12, features=6, classes=3, batch_size=5,
                                   repeats=2)
    assert res["max_train_loss_diff"] < 1e-5
    assert res["loop_cpu_s"] > 0 and res["rows_cpu_s"] > 0 and res["speedup_cpu"] > 0
    again = simulation.training_only("logreg", clients=4, examples=12, features=6, classes=3, batch_size=5,
                                     repeats=1)
    assert again["max_train_loss_diff"] < 1e-5


def test_training_only_takes_the_convolution_form_asked_and_restores_the_default():
    """--training-only --conv-form: the CNN's rows as one grouped convolution or row by row, the
    loop's losses either way; the device's own choice is back afterwards."""
    from benchmarks import simulation
    from client_app import row_forward

    before = row_forward.UNROLLED_CONVOLUTIONS
    forms = {}
    for form in ("grouped", "unrolled", ""):
        res = simulation.training_only("cnn", clients=2, examples=12, features=3072, classes=3, batch_size=8,
                                       repeats=1, conv_form=form)
        assert res["max_train_loss_diff"] < 1e-5 and res["device"] == "cpu"
        forms[form] = res["conv_form"]
        assert row_forward.UNROLLED_CONVOLUTIONS == before
    assert forms == {"grouped": "grouped", "unrolled": "unrolled", "": "unrolled"}  # the CPU's own: row by row


def test_per_round_sizes_partition_the_same_clients():
    from benchmarks import simulation

    digits = simulation.per_round({"method": "fedavg"}, 50, most=100)
    assert digits["num-clients"] == 100 and digits["fraction-train"] == pytest.approx(0.5)
    cnn = simulation.per_round({"num-clients": 100, "fraction-train": 0.1}, 10, most=100)
    assert cnn["num-clients"] == 100 and cnn["fraction-train"] == pytest.approx(0.1)


def test_rows_table_names_the_models_whose_rows_won_at_every_size():
    """gpu_check.sh's table: one line per model and size with the ratios against the plain loop
    and the loop engine; AUTO_MODELS may name a model only where the rows won at every size."""
    from benchmarks import simulation

    def result(model, n, engine, app_s, floor_s=0.1):
        return {"model": model, "clients_per_round": n, "engine": engine,
                "no_eval": {"app_s": app_s, "floor_s": floor_s}}

    app = [result("cnn", 10, "local", 0.2), result("cnn", 10, "vectorised", 0.1),
           result("cnn", 50, "local", 1.0), result("cnn", 50, "vectorised", 0.04, floor_s=0.5),
           result("mlp", 10, "local", 0.2), result("mlp", 10, "vectorised", 0.1),
           result("mlp", 50, "local", 0.2), result("mlp", 50, "vectorised", 0.3)]
    training = [{"model": "cnn", "clients": 50, "device": "cuda", "conv_form": "grouped", "loop_wall_s": 0.5,
                 "rows_wall_s": 0.1, "speedup_wall": 5.0, "max_train_loss_diff": 1e-7}]
    text = simulation.rows_table(app, training, {"device": "cuda", "gpu": "NVIDIA H200", "date": "d", "torch": "t"})
    assert text.startswith("Measured on NVIDIA H200 (d, torch t).")
    assert "| cnn | 50 | 1.000 | 0.040 | 0.500 | **0.08** | 0.04 |" in text
    assert "| mlp | 50 | 0.200 | 0.300 | 0.100 | **3.00** | 1.50 |" in text
    assert "| cnn | 50 | cuda | grouped | 0.5000 | 0.1000 | **5.00×** | 1.0e-07 |" in text
    assert text.rstrip().endswith("(`AUTO_MODELS['cuda'] = ('cnn',)` in client_app/vectorised.py).")


def test_rows_table_without_a_gpu_says_so_and_names_no_model():
    """The smoke run's table (CPU figures) says plainly that nothing was measured on a GPU."""
    from benchmarks import simulation

    app = [{"model": "cnn", "clients_per_round": 2, "engine": e, "no_eval": {"app_s": s, "floor_s": 0.1}}
           for e, s in (("local", 0.2), ("vectorised", 0.1))]
    text = simulation.rows_table(app, [], {"device": "cpu", "gpu": None})
    assert text.startswith("**Not measured here: no GPU.**")
    assert "AUTO_MODELS['cuda']` in client_app/vectorised.py stays as it is." in text
    assert "| cnn | 2 |" in text


def test_load_clients_data_gives_every_client_the_same_examples(tmp_path):
    """benchmarks/load_clients.py's generated folders: the app's parquet reader takes them, and
    partitioner='writer' gives each of num-clients clients exactly --per-client examples, at
    any registered count drawn from the one file."""
    from benchmarks import load_clients
    from client_app.data.parquet import read_parquet
    from client_app.data.partition import partition_by_writer

    for model, shape in (("logreg", (1, 6, 10)), ("mlp", (1, 8, 8))):
        folder = load_clients.write_dataset(tmp_path / model, model, clients=40, per_client=5)
        x, y, writers = read_parquet(folder, "train")
        assert x.shape == (200, *shape) and writers is not None
        assert set(np.unique(y).tolist()) <= set(range(10)) and len(np.unique(y)) > 1
        for clients in (10, 40):
            cfg = load_config({"num-clients": clients, "partitioner": "writer", "min-partition-size": 5,
                               "dataset-path": str(folder)})
            parts = partition_by_writer(writers, cfg)
            assert len(parts) == clients and {len(p) for p in parts} == {5}
            assert len(np.unique(np.concatenate(parts))) == 5 * clients  # disjoint


def test_load_clients_table_has_the_ratio_of_the_largest_to_the_smallest_count():
    from benchmarks import load_clients

    def row(clients, scale):
        return {"model": "logreg", "clients": clients, "per_round": 10, "replies": [10],
                **{k: scale * (i + 1) for i, k in enumerate(load_clients.FIELDS)}}

    text = load_clients.table([row(100, 1.0), row(1000, 3.0), row(300, 2.0)])
    ratio = text.splitlines()[-1].split()
    assert ratio[:2] == ["logreg", "1000/100"] and [float(v) for v in ratio[2:]] == [3.0] * len(load_clients.FIELDS)
    assert load_clients.median_row([row(100, 1.0), row(100, 5.0), row(100, 2.0)])["round_s"] == 2.0 * 3


@pytest.mark.slow
def test_load_clients_runs_the_app_at_two_registered_counts(tmp_path, capsys):
    """Two real simulate runs (tiny): both counts train the same number per round and report
    their timings, memory and the data file's size."""
    from benchmarks import load_clients

    assert load_clients.main(["--clients", "20,40", "--per-round", "4", "--per-client", "5", "--rounds", "2",
                              "--model", "logreg", "--work", str(tmp_path), "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    small, big = out["rows"]
    assert (small["clients"], big["clients"]) == (20, 40)
    for r in (small, big):
        assert r["replies"] == [4, 4] and r["tree_mb"] > 0 and r["round_s"] > 0 and r["eval_s"] > 0
        assert r["wall_s"] > r["setup_s"] > 0
    assert small["data_mb"] == big["data_mb"] == 40 * 5 * 60 * 4 / 2**20
    with open(tmp_path / "out-logreg-40-0" / "summary.json") as fh:
        assert json.load(fh)["num_scored"] == 40  # every registered client scored at the end


def test_flwr_startup_names_each_process_kind_and_tables_the_steps():
    """benchmarks/flwr_startup.py: a process's command line gives its kind (the report's drawing,
    the CLI calls, the SuperLink, the simulation process, Ray's workers before Ray's own
    processes), and the table lists every step and kind it measured."""
    from benchmarks import flwr_startup

    kinds = {cmd: flwr_startup.kind_of(cmd) for cmd in (
        "/v/bin/python -m fedpcd_app.flwr_run --run-config x", "/v/bin/flwr run . local --stream",
        "/v/bin/flwr ls . local", "/v/bin/flower-superlink --insecure", "/v/bin/flwr-simulation --app x",
        "ray::ClientAppActor", "/v/lib/ray/core/src/ray/gcs/gcs_server --x", "/usr/bin/git status", "")}
    assert list(kinds.values()) == ["driver (fedpcd_app.flwr_run)", "flwr CLI: run", "flwr CLI: ls", "SuperLink",
                                    "simulation process (ServerApp)", "Ray workers (ClientApp actors)",
                                    "Ray processes (GCS, raylet, dashboard, ...)", "other: git", "other"]
    steps = [{"step": "round 1 (Ray actors start, import the ClientApp)", "at_s": 9.0, "took_s": 9.0},
             {"step": "exit", "at_s": 12.0, "took_s": 3.0}]
    res = {"run_config": "num-server-rounds=3", "code": "/app", "wall_s": 12.0, "cpu_total_s": 20.0,
           "load_average": [1.0, 1.0, 1.0], "cores": 2, "timeline": steps,
           "cpu_s": {"SuperLink": {"processes": 1, "cpu_s": 4.5}}}
    text = flwr_startup.table(res)
    assert "| round 1 (Ray actors start, import the ClientApp) | 9.0 | 9.0 |" in text
    assert "| exit | 12.0 | 3.0 |" in text and "| SuperLink | 1 | 4.5 |" in text and "20.0 s CPU in all" in text
    assert "code /app" in text
