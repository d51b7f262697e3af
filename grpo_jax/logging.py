"""Run logs: a console progress bar, metrics.jsonl, TensorBoard events and a PNG of the main curves;
completions.jsonl (sampled completions every N steps) and held_out.jsonl (per-example results of the
final evaluation); and each row's scalars to the trackers of `train.report_to` (`TRACKERS`: W&B, MLflow).

Only process 0 writes; on other processes every method is a no-op, so the host loop calls them
unconditionally. Metrics arrive as flat dicts of Python floats (fetched once per step), one row per
step, with optional arrays summarized as TensorBoard histograms (kept in histograms.jsonl).
metrics.jsonl is the record: a resumed run first drops the rows an earlier process logged past
the checkpoint it resumes from (they will be logged again), from every JSONL file alike, and
rewrites TensorBoard's events from the rows kept, so every view holds each step once; the curves are
drawn from the whole record. Rows reach the files synchronously, before the step's checkpoint is
saved (tensorboardX's SummaryWriter queues events in a thread, and a kill lost them), so a kill
never loses a step that a checkpoint holds.
"""

import json
import os
import pathlib
import re
import shutil
import struct
import time
from collections.abc import Sequence

import jax
import numpy as np

# The curves of the final plot, in panel order; a panel is drawn only if its metric was logged.
PLOT_PANELS = (
    ("reward/mean", "eval/accuracy_greedy"),
    ("accuracy", "eval/accuracy_sampled"),
    ("completion/length_mean",),
    ("clip_frac_low", "clip_frac_high"),
    ("kl_k3_mean", "entropy_mean"),
    ("grad_norm",),
)
# The resume-safe logs: rows of step <= the resumed checkpoint's are kept, the rest dropped.
JSONL = ("metrics.jsonl", "histograms.jsonl", "completions.jsonl")
# Shown on the progress bar.
BAR_KEYS = ("reward/mean", "accuracy", "completion/length_mean", "eval/accuracy_greedy")


def read_rows(path: str | pathlib.Path) -> list[dict]:
    """The rows of a metrics.jsonl ([] if there is none); a line cut short by a kill is skipped."""
    rows = []
    for line in pathlib.Path(path).read_text().splitlines() if pathlib.Path(path).is_file() else ():
        try:
            rows.append(json.loads(line))
        except json.JSONDecodeError:
            continue
    return rows


def read_events(directory: str | pathlib.Path) -> list:
    """Every TensorBoard event (tensorboardX's `Event` protos) of the event files in `directory`, in
    file order; raises on a truncated record."""
    from tensorboardX.proto import event_pb2

    events = []
    for path in sorted(pathlib.Path(directory).glob("events.out.tfevents.*")):
        data, at = path.read_bytes(), 0
        while at < len(data):  # records: length (8 bytes), its crc (4), the event, its crc (4)
            (length,) = struct.unpack("<Q", data[at:at + 8])
            if at + 12 + length + 4 > len(data):
                raise ValueError(f"{path}: truncated record at byte {at}")
            events.append(event_pb2.Event.FromString(data[at + 12:at + 12 + length]))
            at += 12 + length + 4
    return events


def _rewrite(path: pathlib.Path, rows: list[dict]) -> None:
    """`path` holding exactly `rows`, replaced atomically."""
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text("".join(json.dumps(r) + "\n" for r in rows))
    os.replace(tmp, path)


class WandbTracker:
    """Weights & Biases: one W&B run per run directory. Its id is kept in `out_dir/wandb.json`, so a resume
    continues the same W&B run (a fresh run starts a new one); W&B keeps the first copy of the steps a
    resume logs again (the exact same run). Project, entity and mode are W&B's own environment variables
    (WANDB_PROJECT, default "grpo_jax"; WANDB_MODE=offline writes `out_dir/wandb/` for `wandb sync`)."""

    def __init__(self, out_dir: pathlib.Path, config: dict, resume_step: int | None):
        import wandb

        path = out_dir / "wandb.json"
        run_id = json.loads(path.read_text())["id"] if resume_step is not None and path.is_file() else None
        self.run = wandb.init(id=run_id, resume="allow", dir=out_dir, name=out_dir.name, config=config,
                              project=os.environ.get("WANDB_PROJECT", "grpo_jax"))
        path.write_text(json.dumps({"id": self.run.id}))

    def log(self, step: int, scalars: dict[str, float]) -> None:
        if step >= self.run.step:  # below: a step this W&B run holds already
            self.run.log(scalars, step=step)

    def close(self) -> None:
        self.run.finish()


class MlflowTracker:
    """MLflow: one MLflow run per run directory, its id kept in `out_dir/mlflow.json`, so a resume continues
    the same MLflow run and skips the steps it holds (as W&B does). Where runs go is MLflow's own
    MLFLOW_TRACKING_URI (a server, sqlite:///FILE, or file:///DIR with MLFLOW_ALLOW_FILE_STORE=true) and
    MLFLOW_EXPERIMENT_NAME (default "grpo_jax").
    MLflow refuses some characters in metric names: '@' (pass@k) and any other become '_'."""

    def __init__(self, out_dir: pathlib.Path, config: dict, resume_step: int | None):
        import mlflow

        self.client, path = mlflow.MlflowClient(), out_dir / "mlflow.json"
        if resume_step is not None and path.is_file():
            self.run_id = json.loads(path.read_text())["id"]
            self.client.update_run(self.run_id, "RUNNING")
        else:
            name = os.environ.get("MLFLOW_EXPERIMENT_NAME", "grpo_jax")
            experiment = self.client.get_experiment_by_name(name)
            experiment = experiment.experiment_id if experiment else self.client.create_experiment(name)
            self.run_id = self.client.create_run(experiment, run_name=out_dir.name).info.run_id
            params = [mlflow.entities.Param(k, str(v)[:6000]) for k, v in config.items()]
            for i in range(0, len(params), 100):  # MLflow's limit per batch
                self.client.log_batch(self.run_id, params=params[i:i + 100])
        path.write_text(json.dumps({"id": self.run_id}))
        self.held = max((m.step for m in self.client.get_metric_history(self.run_id, "time/run_s")), default=-1)

    def log(self, step: int, scalars: dict[str, float]) -> None:
        from mlflow.entities import Metric

        if step > self.held:  # else: a step this MLflow run holds already
            now = int(time.time() * 1000)
            self.client.log_batch(self.run_id, metrics=[Metric(re.sub(r"[^\w/. :-]", "_", k), v, now, step)
                                                        for k, v in scalars.items() if k != "step"])

    def close(self) -> None:
        self.client.set_terminated(self.run_id)


# train.report_to names -> a tracker: made on process 0 as (out_dir, the run's flattened config, the
# resumed step or None), then log(step, scalars) per row and close(); a fork adds one class and one line.
TRACKERS = {"wandb": WandbTracker, "mlflow": MlflowTracker}


class MetricsLogger:
    """Writes `out_dir/metrics.jsonl`, `out_dir/tensorboard/` (its histograms kept in
    `out_dir/histograms.jsonl`), `out_dir/completions.jsonl`, `out_dir/held_out.jsonl` and, on close,
    `out_dir/curves.png`.

    `resume_step` is the step of the checkpoint the run continues from (None: a fresh run, which
    keeps no earlier rows). Every row gains "time/run_s": the run's wall seconds so far, counted from
    `started` (a `time.perf_counter()`; default: now) and continued from the resumed step's row, so
    that each process's start-up counts and the steps a kill lost (logged again) count once. The rows'
    scalars also go to the trackers named in `report_to` (`TRACKERS`), given the run's `config`."""

    def __init__(self, out_dir: str | pathlib.Path, total_steps: int, resume_step: int | None = None,
                 started: float | None = None, report_to: Sequence[str] = (), config: dict | None = None):
        self.enabled = jax.process_index() == 0
        self.out_dir = pathlib.Path(out_dir)
        keep = -1 if resume_step is None else resume_step
        self.history = [r for r in read_rows(self.out_dir / "metrics.jsonl") if r["step"] <= keep]
        earlier = self.history[-1].get("time/run_s", 0.0) if self.history else 0.0
        self.clock = (time.perf_counter() if started is None else started) - earlier
        if not self.enabled:
            return
        import tqdm
        from tensorboardX.event_file_writer import EventsWriter

        kept = {name: [r for r in read_rows(self.out_dir / name) if r["step"] <= keep] for name in JSONL}
        self.out_dir.mkdir(parents=True, exist_ok=True)
        self.files = {}
        for name, rows in kept.items():
            _rewrite(self.out_dir / name, rows)
            self.files[name] = open(self.out_dir / name, "a")
        shutil.rmtree(self.out_dir / "tensorboard", ignore_errors=True)
        (self.out_dir / "tensorboard").mkdir()
        self.tb = EventsWriter(str(self.out_dir / "tensorboard" / "events"))
        for row in self.history:
            self._tensorboard(row["step"], scalars=row)
        for row in kept["histograms.jsonl"]:
            self._tensorboard(row["step"], histograms=row)
        self.bar = tqdm.tqdm(total=total_steps, initial=max(keep, 0), dynamic_ncols=True)
        self.trackers = [TRACKERS[name](self.out_dir, config or {}, resume_step) for name in report_to]

    def _tensorboard(self, step: int, scalars: dict | None = None, histograms: dict | None = None) -> None:
        """One event holding a row's scalars or histograms, written and flushed (fsync) before returning."""
        from google.protobuf import json_format
        from tensorboardX.proto import event_pb2, summary_pb2

        values = [summary_pb2.Summary.Value(tag=k, simple_value=v) for k, v in (scalars or {}).items() if k != "step"]
        values += [summary_pb2.Summary.Value(tag=k, histo=json_format.ParseDict(v, summary_pb2.HistogramProto()))
                   for k, v in (histograms or {}).items() if k != "step"]
        self.tb.write_event(event_pb2.Event(wall_time=time.time(), step=step, summary=summary_pb2.Summary(value=values)))
        self.tb.flush()

    def _append(self, name: str, rows: list[dict]) -> None:
        self.files[name].write("".join(json.dumps(r) + "\n" for r in rows))
        self.files[name].flush()

    def log(self, step: int, metrics: dict[str, float], histograms: dict[str, Sequence[float] | np.ndarray] | None = None) -> None:
        """The step's row of scalars, and TensorBoard histograms of the `histograms` values."""
        if not self.enabled:
            return
        row = {"step": step, **{k: float(v) for k, v in metrics.items()}, "time/run_s": time.perf_counter() - self.clock}
        self.history.append(row)
        self._append("metrics.jsonl", [row])
        self._tensorboard(step, scalars=row)
        for tracker in self.trackers:
            tracker.log(step, row)
        if histograms:
            from google.protobuf import json_format
            from tensorboardX.summary import make_histogram

            hist = {"step": step, **{k: json_format.MessageToDict(make_histogram(np.asarray(v, np.float64), "auto"))
                                     for k, v in histograms.items() if np.size(v)}}
            self._append("histograms.jsonl", [hist])
            self._tensorboard(step, histograms=hist)
        self.bar.set_postfix({k.split("/")[-1]: f"{row[k]:.3g}" for k in BAR_KEYS if k in row})
        self.bar.update(step - self.bar.n)

    def log_completions(self, step: int, records: list[dict]) -> None:
        """Appends the step's completions (dicts of JSON values) to completions.jsonl."""
        if self.enabled:
            self._append("completions.jsonl", [{"step": step, **r} for r in records])

    def write_held_out(self, step: int, records: list[dict]) -> None:
        """held_out.jsonl: one row per held-out example, as evaluated at `step` (the run's last),
        replacing any earlier."""
        if self.enabled:
            _rewrite(self.out_dir / "held_out.jsonl", [{"step": step, **r} for r in records])

    def message(self, text: str) -> None:
        """A line on the console that leaves the progress bar intact."""
        if self.enabled:
            self.bar.write(text)

    def close(self) -> None:
        """Flushes everything and draws the curves of the whole run, earlier processes' steps included."""
        if not self.enabled:
            return
        self.bar.close()
        self.tb.close()
        for tracker in self.trackers:
            tracker.close()
        for f in self.files.values():
            f.close()
        plot_curves(self.history, self.out_dir / "curves.png")


def plot_curves(history: list[dict], path: str | pathlib.Path) -> None:
    """One panel per group of `PLOT_PANELS` that has data, metric against step."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    panels = [[k for k in keys if any(k in r for r in history)] for keys in PLOT_PANELS]
    panels = [p for p in panels if p]
    if not panels:
        return
    fig, axes = plt.subplots(1, len(panels), figsize=(3.6 * len(panels), 3.0), squeeze=False)
    for ax, keys in zip(axes[0], panels):
        for k in keys:
            pts = [(r["step"], r[k]) for r in history if k in r]
            ax.plot(*zip(*pts), marker="." if len(pts) < 30 else None, label=k)
        ax.set_xlabel("step")
        ax.legend(fontsize=7)
        ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
