"""train.report_to: W&B (offline) and MLflow (a local file store) get every logged row through the one logger,
only on process 0, and a resume continues the same tracker run."""

import json
import struct

import jax
import pytest

from grpo_jax import logging as run_logging, run
from grpo_jax.config import TrainConfig
from test_trainer import config


def wandb_rows(run_dir) -> list[dict]:
    """The history rows of an offline W&B run file: a LevelDB-style log (a 7-byte file header, 32 KiB blocks of
    records: crc 4, length 2, kind 1 (1 whole, 2 first, 3 middle, 4 last), data) of `Record` protos."""
    from wandb.proto import wandb_internal_pb2

    data, at, part, rows = next(run_dir.glob("run-*.wandb")).read_bytes(), 7, b"", []
    while at + 7 <= len(data):
        left = 32768 - at % 32768
        length, kind = struct.unpack("<HB", data[at + 4:at + 7])
        if left < 7 or kind == 0:  # a block's zero padding
            at += left
            continue
        part, at = part + data[at + 7:at + 7 + length], at + 7 + length
        if kind in (1, 4):
            record = wandb_internal_pb2.Record.FromString(part)
            part = b""
            if record.WhichOneof("record_type") == "history":
                rows.append({(i.key or "/".join(i.nested_key)): json.loads(i.value_json) for i in record.history.item})
    return rows


def test_wandb_gets_every_row_and_a_resume_continues_its_run(tmp_path, monkeypatch):
    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_SILENT", "true")
    cfg = config(tmp_path, steps=1, checkpoint_every=1, report_to=("wandb",))
    run.train(cfg)
    first = json.loads((tmp_path / "wandb.json").read_text())["id"]
    run.train(config(tmp_path, steps=2, checkpoint_every=1, report_to=("wandb",)))  # resumes from step 1
    assert json.loads((tmp_path / "wandb.json").read_text())["id"] == first
    runs = sorted((tmp_path / "wandb").glob(f"offline-run-*-{first}"))
    assert len(runs) == 2  # two processes' parts of one W&B run (`wandb sync` joins them)
    logged = [r for d in runs for r in wandb_rows(d)]
    assert [r["_step"] for r in logged] == [0, 1, 2]
    metrics = {r["step"]: r for r in run_logging.read_rows(tmp_path / "metrics.jsonl")}
    for r in logged:  # each row's scalars, as metrics.jsonl holds them
        assert r["reward/mean" if r["_step"] else "eval/accuracy_greedy"] == metrics[r["_step"]][
            "reward/mean" if r["_step"] else "eval/accuracy_greedy"]
    run.train(config(tmp_path / "fresh", steps=1, report_to=("wandb",)))  # another run directory: another W&B run
    assert json.loads((tmp_path / "fresh" / "wandb.json").read_text())["id"] != first


def test_only_process_0_reports_and_unknown_trackers_are_refused(tmp_path, monkeypatch):
    monkeypatch.setattr(jax, "process_index", lambda: 1)
    monkeypatch.setenv("MLFLOW_TRACKING_URI", (tmp_path / "mlruns").as_uri())
    logger = run_logging.MetricsLogger(tmp_path, 2, report_to=("wandb", "mlflow"), config={})
    logger.log(1, {"loss": 1.0})
    logger.close()
    assert not (tmp_path / "wandb.json").exists() and not (tmp_path / "wandb").exists()
    assert not (tmp_path / "mlflow.json").exists() and not (tmp_path / "mlruns").exists()
    with pytest.raises(ValueError, match=r"TrainConfig.report_to=\('comet',\) names an unknown tracker; choose from \['mlflow', 'wandb'\]"):
        TrainConfig(report_to=("comet",))


def test_mlflow_gets_every_row_and_a_resume_continues_its_run(tmp_path, monkeypatch):
    import mlflow

    monkeypatch.setenv("MLFLOW_TRACKING_URI", (tmp_path / "mlruns").as_uri())  # a file store: no server, no network
    monkeypatch.setenv("MLFLOW_ALLOW_FILE_STORE", "true")  # MLflow 3 keeps it behind this switch
    run.train(config(tmp_path / "run", steps=1, checkpoint_every=1, eval_samples=2, report_to=("mlflow",)))
    first = json.loads((tmp_path / "run" / "mlflow.json").read_text())["id"]
    run.train(config(tmp_path / "run", steps=2, checkpoint_every=1, eval_samples=2, report_to=("mlflow",)))  # resumes from step 1
    assert json.loads((tmp_path / "run" / "mlflow.json").read_text())["id"] == first
    client = mlflow.MlflowClient()
    got = client.get_run(first)
    assert got.info.status == "FINISHED" and got.data.params["train.steps"] == "1"  # the config of the run's start
    metrics = {r["step"]: r for r in run_logging.read_rows(tmp_path / "run" / "metrics.jsonl")}
    for key in ("time/run_s", "reward/mean", "eval/accuracy_greedy"):  # each step once, as metrics.jsonl holds it
        history = client.get_metric_history(first, key)
        assert [(m.step, m.value) for m in history] == [(s, r[key]) for s, r in metrics.items() if key in r]
    names = {k for r in metrics.values() for k in r if k != "step"}
    assert sorted(metrics) == [0, 1, 2] and any("@" in k for k in names)  # pass@k: a name MLflow refuses as is
    assert set(got.data.metrics) == {k.replace("@", "_") for k in names}
    run.train(config(tmp_path / "fresh", steps=1, eval_samples=2, report_to=("mlflow",)))  # another run directory: another MLflow run
    assert json.loads((tmp_path / "fresh" / "mlflow.json").read_text())["id"] != first


def test_mlflow_keeps_the_first_copy_of_a_step_a_resume_logs_again(tmp_path, monkeypatch):
    """A kill after step 2 was logged but before its checkpoint: the resume from step 1 logs step 2 again."""
    import mlflow

    monkeypatch.setenv("MLFLOW_TRACKING_URI", (tmp_path / "mlruns").as_uri())
    monkeypatch.setenv("MLFLOW_ALLOW_FILE_STORE", "true")
    logger = run_logging.MetricsLogger(tmp_path, 3, report_to=("mlflow",), config={"train.steps": 3})
    for step in (1, 2):
        logger.log(step, {"loss": float(step)})
    logger.close()
    logger = run_logging.MetricsLogger(tmp_path, 3, resume_step=1, report_to=("mlflow",), config={"train.steps": 3})
    for step in (2, 3):
        logger.log(step, {"loss": 10.0 * step})
    logger.close()
    run_id = json.loads((tmp_path / "mlflow.json").read_text())["id"]
    assert [(m.step, m.value) for m in mlflow.MlflowClient().get_metric_history(run_id, "loss")] == [(1, 1.0), (2, 2.0), (3, 30.0)]
