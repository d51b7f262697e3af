"""train.report_to: W&B (offline) gets every logged row through the one logger, only on process 0, and a resume
continues the same W&B run."""

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
    logger = run_logging.MetricsLogger(tmp_path, 2, report_to=("wandb",), config={})
    logger.log(1, {"loss": 1.0})
    logger.close()
    assert not (tmp_path / "wandb.json").exists() and not (tmp_path / "wandb").exists()
    with pytest.raises(ValueError, match=r"TrainConfig.report_to=\('mlflow',\) names an unknown tracker; choose from \['wandb'\]"):
        TrainConfig(report_to=("mlflow",))
