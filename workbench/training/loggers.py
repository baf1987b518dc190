"""Experiment tracking sinks for `Trainer.fit`: jsonl, TensorBoard, trackio, wandb.

`training.loggers` names them (default `["jsonl"]`). `fit` opens them when it starts,
gives them every step's metrics (the names `train_step` returns, e.g. `reward/mean`,
`env/success_rate`, `actor/pg_loss`, `perf/step_seconds`, at the step `metrics["step"]`),
after the first step and every `training.log_episodes_every` steps after it (0-based steps
0, N, 2N, ...) a table of that step's best and worst episodes (`episode_rows`), and
closes them when it returns (also after an error).

    jsonl        `log_dir/metrics.jsonl` (one line per step: every number or string in the
                 metrics) and `log_dir/episodes.jsonl` (one line per table row). Opened with
                 `workbench.training.metrics_file.open_metrics_log`: lines of steps at or after the step `fit`
                 starts from are dropped first, so steps redone after a resume appear once.
    tensorboard  `log_dir/tensorboard/` event files: a scalar per metric, the episode table
                 as markdown text under the tag "episode_table" (`EPISODE_TABLE`).
    trackio      a local trackio run (project "workbench", name `training.run_name`) in
                 trackio's own folder (`TRACKIO_DIR`, default ~/.cache/huggingface/trackio);
                 a later `fit` continues the same run. Episodes as a `trackio.Table`
                 under "episode_table".
    wandb        a wandb run under `log_dir/wandb/`, offline unless `WANDB_MODE` says
                 otherwise (`wandb sync` uploads it later). Episodes as a `wandb.Table`
                 under "episode_table".

`log_dir` is `training.log_dir` (the CLI sets its output folder), else
`checkpoint.output_dir`, so a run's logs sit with its checkpoints and nothing is written
into the working directory. Every package is imported only when its logger is asked for.
"""
from __future__ import annotations

import hashlib
import json
import os
import re
from pathlib import Path
from typing import Any, Sequence

from workbench.config import ConfigError, ConfigStore
from workbench.training.metrics_file import open_metrics_log

#: trackio / wandb project name.
PROJECT = "workbench"
#: Best and worst episodes each in an episode table.
EPISODES_PER_END = 2
#: Name (key, tag) of the episode table in every sink ("episodes" is a metric: the batch size).
EPISODE_TABLE = "episode_table"
#: Columns of an episode table, in order.
EPISODE_COLUMNS = ("step", "rank", "episode_id", "env_seed", "score", "success", "turns", "text")


def log_dir(config: ConfigStore) -> Path:
    """Where the loggers write: `training.log_dir`, else `checkpoint.output_dir`."""
    if config.training.log_dir is not None:
        return Path(config.training.log_dir)
    return Path(config.checkpoint.output_dir).resolve()


def run_name(config: ConfigStore) -> str:
    """`training.run_name`, else the log folder's name."""
    return config.training.run_name or log_dir(config).resolve().name


def scalar_metrics(metrics: dict[str, Any]) -> dict[str, float]:
    """The numeric metrics of a step as floats, without "step" itself."""
    return {k: float(v) for k, v in metrics.items()
            if k != "step" and isinstance(v, (int, float)) and not isinstance(v, bool)}


def episode_text(episode: Any) -> str:
    """An episode's messages as "role: content" paragraphs."""
    return "\n\n".join(f"{m['role']}: {m['content']}" for m in episode.messages)


def episode_rows(batch: Any, step: int, per_end: int = EPISODES_PER_END) -> list[dict[str, Any]]:
    """Rows (`EPISODE_COLUMNS`) for the best and the worst `per_end` episodes of `batch`
    by score (the total environment reward where an episode has no score); an episode is
    listed once even when it is among both."""
    def score(ep: Any) -> float:
        return ep.outcome

    ranked = sorted(batch, key=score, reverse=True)
    picked: list[tuple[str, Any]] = [(f"best {i + 1}", ep) for i, ep in enumerate(ranked[:per_end])]
    chosen = {id(ep) for _, ep in picked}
    worst = [ep for ep in reversed(ranked) if id(ep) not in chosen][:per_end]
    picked += [(f"worst {i + 1}", ep) for i, ep in enumerate(worst)]
    return [{"step": step, "rank": rank, "episode_id": str(ep.episode_id), "env_seed": ep.env_seed,
             "score": score(ep), "success": bool(ep.success), "turns": int(ep.num_turns),
             "text": episode_text(ep)} for rank, ep in picked]


def markdown_table(rows: Sequence[dict[str, Any]]) -> str:
    """Episode rows as a markdown table (newlines and pipes in the text escaped)."""
    def cell(v: Any) -> str:
        return str(v).replace("|", "\\|").replace("\n", "<br>")

    lines = ["| " + " | ".join(EPISODE_COLUMNS) + " |", "|" + "---|" * len(EPISODE_COLUMNS)]
    lines += ["| " + " | ".join(cell(r[c]) for c in EPISODE_COLUMNS) + " |" for r in rows]
    return "\n".join(lines)


class Logger:
    """One sink. `fit` calls open(step) once, then log_metrics / log_episodes, then close()."""

    name = ""

    def __init__(self, config: ConfigStore):
        self.config = config
        self.dir = log_dir(config)

    def open(self, step: int) -> None:
        """Start (or continue) logging; `step` is the first step `fit` will take."""

    def log_metrics(self, metrics: dict[str, Any], step: int) -> None:
        raise NotImplementedError

    def log_episodes(self, rows: list[dict[str, Any]], step: int) -> None:
        raise NotImplementedError

    def close(self) -> None:
        """Flush and release files or runs."""


class JsonlLogger(Logger):
    name = "jsonl"

    def open(self, step: int) -> None:
        self.dir.mkdir(parents=True, exist_ok=True)
        self.metrics_file = open_metrics_log(self.dir / "metrics.jsonl", step)
        self.episodes_file = open_metrics_log(self.dir / "episodes.jsonl", step)

    def log_metrics(self, metrics: dict[str, Any], step: int) -> None:
        row = {k: v for k, v in metrics.items() if isinstance(v, (int, float, str))}
        self.metrics_file.write(json.dumps(row) + "\n")
        self.metrics_file.flush()

    def log_episodes(self, rows: list[dict[str, Any]], step: int) -> None:
        self.episodes_file.write("".join(json.dumps(r) + "\n" for r in rows))
        self.episodes_file.flush()

    def close(self) -> None:
        for f in (getattr(self, "metrics_file", None), getattr(self, "episodes_file", None)):
            if f is not None:
                f.close()


class TensorBoardLogger(Logger):
    name = "tensorboard"

    def open(self, step: int) -> None:
        from torch.utils.tensorboard import SummaryWriter

        self.writer = SummaryWriter(log_dir=str(self.dir / "tensorboard"), purge_step=step)

    def log_metrics(self, metrics: dict[str, Any], step: int) -> None:
        for k, v in scalar_metrics(metrics).items():
            self.writer.add_scalar(k, v, step)

    def log_episodes(self, rows: list[dict[str, Any]], step: int) -> None:
        self.writer.add_text(EPISODE_TABLE, markdown_table(rows), step)

    def close(self) -> None:
        if getattr(self, "writer", None) is not None:
            self.writer.close()
            self.writer = None


class TrackioLogger(Logger):
    name = "trackio"

    def open(self, step: int) -> None:
        import trackio

        self.trackio = trackio
        self.run = trackio.init(project=PROJECT, name=run_name(self.config), config=self.config.to_dict(),
                                resume="allow", embed=False)

    def log_metrics(self, metrics: dict[str, Any], step: int) -> None:
        self.run.log(scalar_metrics(metrics), step=step)

    def log_episodes(self, rows: list[dict[str, Any]], step: int) -> None:
        table = self.trackio.Table(columns=list(EPISODE_COLUMNS), data=[[r[c] for c in EPISODE_COLUMNS] for r in rows])
        self.run.log({EPISODE_TABLE: table}, step=step)

    def close(self) -> None:
        if getattr(self, "run", None) is not None:
            self.run.finish()
            self.run = None


class WandbLogger(Logger):
    name = "wandb"

    def open(self, step: int) -> None:
        import wandb

        self.wandb = wandb
        name = run_name(self.config)
        # A stable id per log folder and name: a later fit (or a resumed run) continues it.
        digest = hashlib.sha1(f"{self.dir.resolve()}|{name}".encode()).hexdigest()[:8]
        run_id = re.sub(r"[^A-Za-z0-9_-]", "-", name)[:40] + "-" + digest
        (self.dir / "wandb").mkdir(parents=True, exist_ok=True)
        self.run = wandb.init(project=PROJECT, name=name, id=run_id, resume="allow", dir=str(self.dir),
                              mode=os.environ.get("WANDB_MODE", "offline"), config=self.config.to_dict(),
                              reinit="create_new")

    def log_metrics(self, metrics: dict[str, Any], step: int) -> None:
        self.run.log(scalar_metrics(metrics), step=step)

    def log_episodes(self, rows: list[dict[str, Any]], step: int) -> None:
        table = self.wandb.Table(columns=list(EPISODE_COLUMNS), data=[[r[c] for c in EPISODE_COLUMNS] for r in rows])
        self.run.log({EPISODE_TABLE: table}, step=step)

    def close(self) -> None:
        if getattr(self, "run", None) is not None:
            self.run.finish()
            self.run = None


#: `training.loggers` name -> class.
LOGGERS: dict[str, type[Logger]] = {cls.name: cls for cls in (JsonlLogger, TensorBoardLogger, TrackioLogger, WandbLogger)}
#: What to install for each logger that needs a package.
PACKAGES = {"tensorboard": "tensorboard", "trackio": "trackio", "wandb": "wandb"}


class LoggerGroup:
    """The loggers `training.loggers` names, driven together by `fit`."""

    def __init__(self, config: ConfigStore):
        names = list(config.training.loggers)
        unknown = [n for n in names if n not in LOGGERS]
        if unknown:
            raise ConfigError(f"training.loggers: unknown logger(s) {unknown}; valid: {sorted(LOGGERS)}")
        every = config.training.log_episodes_every
        if not isinstance(every, int) or every < 0:
            raise ConfigError(f"training.log_episodes_every must be an integer >= 0, got {every!r}")
        self.config = config
        self.loggers = [LOGGERS[n](config) for n in dict.fromkeys(names)]

    def open(self, step: int) -> "LoggerGroup":
        opened = []
        try:
            for logger in self.loggers:
                try:
                    logger.open(step)
                except ImportError as exc:
                    raise ConfigError(f"training.loggers has {logger.name!r}, which needs "
                                      f"`pip install {PACKAGES[logger.name]}` ({exc})") from exc
                opened.append(logger)
        except BaseException:
            for logger in opened:
                logger.close()
            raise
        return self

    def log_step(self, metrics: dict[str, Any], batch: Any, completed_steps: int) -> None:
        """Log one step's metrics; after the first completed step and every
        `log_episodes_every`-th after it (completed steps 1, N+1, 2N+1, ...: metrics steps
        0, N, 2N), also the episode table of its batch, so a short run has one too."""
        step = int(metrics["step"])
        for logger in self.loggers:
            logger.log_metrics(metrics, step)
        every = self.config.training.log_episodes_every
        if every and batch is not None and (completed_steps - 1) % every == 0:
            rows = episode_rows(batch, step)
            for logger in self.loggers:
                logger.log_episodes(rows, step)

    def close(self) -> None:
        errors = []
        for logger in self.loggers:
            try:
                logger.close()
            except Exception as exc:  # close the others anyway
                errors.append(exc)
        if errors:
            raise errors[0]

    def __enter__(self) -> "LoggerGroup":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

