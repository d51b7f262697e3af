"""Run logs: a console progress bar, metrics.jsonl, TensorBoard events and a PNG of the main curves.

Only process 0 writes; on other processes every method is a no-op, so the host loop calls them
unconditionally. Metrics arrive as flat dicts of Python floats (fetched once per step), one row per
step. metrics.jsonl is the record: a resumed run first drops the rows an earlier process logged past
the checkpoint it resumes from (they will be logged again) and rewrites TensorBoard's events from the
rows kept, so every view holds each step once; the curves are drawn from the whole record. Rows reach
both files synchronously, before the step's checkpoint is saved (tensorboardX's SummaryWriter queues
events in a thread, and a kill lost them), so a kill never loses a step that a checkpoint holds.
"""

import json
import os
import pathlib
import shutil
import time

import jax

# The curves of the final plot, in panel order; a panel is drawn only if its metric was logged.
PLOT_PANELS = (
    ("reward/mean", "eval/accuracy_greedy"),
    ("accuracy", "eval/accuracy_sampled"),
    ("completion/length_mean",),
    ("clip_frac_low", "clip_frac_high"),
    ("kl_k3_mean", "entropy_mean"),
    ("grad_norm",),
)
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


class MetricsLogger:
    """Writes `out_dir/metrics.jsonl`, `out_dir/tensorboard/` and, on close, `out_dir/curves.png`.

    `resume_step` is the step of the checkpoint the run continues from (None: a fresh run, which
    keeps no earlier rows)."""

    def __init__(self, out_dir: str | pathlib.Path, total_steps: int, resume_step: int | None = None):
        self.enabled = jax.process_index() == 0
        self.out_dir = pathlib.Path(out_dir)
        path = self.out_dir / "metrics.jsonl"
        keep = -1 if resume_step is None else resume_step
        self.history = [r for r in read_rows(path) if r["step"] <= keep]
        if not self.enabled:
            return
        import tqdm
        from tensorboardX.event_file_writer import EventsWriter

        self.out_dir.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(".jsonl.tmp")
        tmp.write_text("".join(json.dumps(r) + "\n" for r in self.history))
        os.replace(tmp, path)
        self.jsonl = open(path, "a")
        shutil.rmtree(self.out_dir / "tensorboard", ignore_errors=True)
        (self.out_dir / "tensorboard").mkdir()
        self.tb = EventsWriter(str(self.out_dir / "tensorboard" / "events"))
        for row in self.history:
            self._tensorboard(row)
        self.bar = tqdm.tqdm(total=total_steps, initial=max(keep, 0), dynamic_ncols=True)

    def _tensorboard(self, row: dict) -> None:
        """One event holding the row's scalars, written and flushed (fsync) before returning."""
        from tensorboardX.proto import event_pb2, summary_pb2

        values = [summary_pb2.Summary.Value(tag=k, simple_value=v) for k, v in row.items() if k != "step"]
        self.tb.write_event(event_pb2.Event(wall_time=time.time(), step=row["step"], summary=summary_pb2.Summary(value=values)))
        self.tb.flush()

    def log(self, step: int, metrics: dict[str, float]) -> None:
        if not self.enabled:
            return
        row = {"step": step, **{k: float(v) for k, v in metrics.items()}}
        self.history.append(row)
        self.jsonl.write(json.dumps(row) + "\n")
        self.jsonl.flush()
        self._tensorboard(row)
        self.bar.set_postfix({k.split("/")[-1]: f"{row[k]:.3g}" for k in BAR_KEYS if k in row})
        self.bar.update(step - self.bar.n)

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
        self.jsonl.close()
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
