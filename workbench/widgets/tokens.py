"""`TokenView`: an episode's tokens coloured by a per-token quantity.

    view = TokenView(batch, tokenizer)          # offers only the fields the batch has
    view.field = "kl"                           # or pick it in the dropdown
    view.index = 2                              # another episode
    view = TokenView(run, step=3)               # a reopened run (`load_run`), its model's tokenizer

Signed quantities (advantages, kl, ratio around 1, values, returns, rewards) use a
blue-white-red scale centred on their neutral value; logprobs use white (likely)
to purple (unlikely); entropy white (sure) to purple (unsure); `loss_mask` marks
trained tokens green. By default the scale is the shown episode's own (robust max
over its trained tokens), so one episode is never washed out by another's extreme
values; `scale="batch"` (or the "scale" toggle) shares one scale across the batch so
colours compare across episodes. The legend prints the scale's ends; a field that is
0 on every trained token reads "all 0". Tokens the policy
did not sample (prompt, observations, tool results, template glue, human turns)
are grey and italic. Hover a token to read its position, id, text and value. Lines
break between tokens, never inside one. Above the tokens, the episode's score beside its
group's mean and std, and the advantage they give (`workbench.widgets._groups`): why a lost
game can be red.

`render_tokens_html(batch, index, field, tokenizer)` is the plain function behind it.
"""
from __future__ import annotations

import math
from typing import Any

import ipywidgets as widgets
import torch
import traitlets

from workbench.trajectory import TOKEN_FIELDS, Episode, TrajectoryBatch
from workbench.widgets._groups import group_line_html
from workbench.widgets._html import (
    MASK_RGB, STYLE, _mix, diverging_color, esc, gradient_css, rgb_css, sequential_color,
)
from workbench.widgets._runs import batch_of, is_run
from workbench.widgets.conversation import episode_label

__all__ = ["TokenView", "render_tokens_html", "available_fields", "field_scale", "decode_tokens",
           "FIELD_KINDS", "SCALES"]

#: How each per-token field is coloured: (kind, neutral value). Order = dropdown order.
FIELD_KINDS: dict[str, tuple[str, float]] = {
    "advantages": ("diverging", 0.0),
    "kl": ("diverging", 0.0),
    "rollout_logprobs": ("logprob", 0.0),
    "old_logprobs": ("logprob", 0.0),
    "ref_logprobs": ("logprob", 0.0),
    "new_logprobs": ("logprob", 0.0),
    "ratio": ("diverging", 1.0),
    "rollout_is_weights": ("diverging", 1.0),  # training.rollout_is: truncated pi_old / pi_rollout
    "entropy": ("sequential", 0.0),
    "loss_mask": ("mask", 0.0),
    "values": ("diverging", 0.0),
    "returns": ("diverging", 0.0),
    "token_level_scores": ("diverging", 0.0),
    "token_level_rewards": ("diverging", 0.0),
    "diff_delta": ("diverging", 0.0),  # workbench.debug.compare_policies
    "diff_kl": ("sequential", 0.0),
    "diff_logprobs_a": ("logprob", 0.0),
    "diff_logprobs_b": ("logprob", 0.0),
    "recomputed_logprobs": ("logprob", 0.0),  # workbench.importers.recompute: a run imported as text
    "recomputed_entropy": ("sequential", 0.0),
    "recomputed_kl": ("sequential", 0.0),
}
_NOT_SHOWN = ("input_ids", "attention_mask", "position_ids")


def available_fields(batch: TrajectoryBatch) -> list[str]:
    """Per-token fields present in the batch, in display order."""
    known = [f for f in FIELD_KINDS if batch.has(f)]
    extra = [f for f in TOKEN_FIELDS if batch.has(f) and f not in FIELD_KINDS and f not in _NOT_SHOWN]
    return known + extra


SCALES = ("episode", "batch")


def field_scale(batch: TrajectoryBatch, field: str, index: int | None = None) -> tuple[str, float, float]:
    """(kind, low, high) of the colour scale of `field` over trained tokens.

    Over the whole batch, or over episode `index` only when given.
    diverging: (centre - s, centre + s) with s the 98th percentile of |v - centre|
    (low == high == centre when every value is the centre: nothing to colour);
    logprob: (2nd percentile, 0); sequential: (0, 98th percentile); mask: (0, 1).
    """
    kind, center = FIELD_KINDS.get(field, ("diverging", 0.0))
    if kind == "mask":
        return kind, 0.0, 1.0
    values = batch.tensors[field].float()
    mask = batch.tensors["loss_mask"] > 0
    if index is not None:
        values, mask = values[index:index + 1], mask[index:index + 1]
        if not mask.any():
            mask = batch.tensors["attention_mask"][index:index + 1] > 0
    elif not mask.any():
        mask = batch.tensors["attention_mask"] > 0
    v = values[mask]
    v = v[torch.isfinite(v)]
    if v.numel() == 0:
        return kind, center - 1.0, center + 1.0
    if kind == "diverging":
        s = float(torch.quantile((v - center).abs(), 0.98)) if v.numel() > 1 else float((v - center).abs().max())
        s = s if s > 0 else float((v - center).abs().max())
        return kind, center - s, center + s
    if kind == "logprob":
        low = float(torch.quantile(v, 0.02)) if v.numel() > 1 else float(v.min())
        return kind, min(low, -1e-6), 0.0
    high = float(torch.quantile(v, 0.98)) if v.numel() > 1 else float(v.max())
    return kind, 0.0, max(high, 1e-8)


def token_style(value: float, trained: bool, kind: str, low: float, high: float) -> tuple[str, str]:
    """(background, text colour) of one token."""
    if not trained:
        return "transparent", "#8a8a8a"
    if kind == "mask":
        return rgb_css(_mix(MASK_RGB, 0.45)), "#111"
    if kind == "diverging":
        center = (low + high) / 2
        return diverging_color(value, center, (high - low) / 2)
    if kind == "logprob":
        return sequential_color(value, low, high, reverse=True)
    return sequential_color(value, low, high)


def decode_tokens(tokenizer: Any, ids: list[int]) -> list[str]:
    """Each id decoded on its own (special tokens kept)."""
    if tokenizer is None:
        return [f"⟨{i}⟩" for i in ids]
    return list(tokenizer.batch_decode([[i] for i in ids], skip_special_tokens=False))


def _shown_text(text: str) -> str:
    out = esc(text)
    if "\n" in text:
        out = out.replace("\n", '<span style="opacity:.45">↵</span>\n')
    return out if text else '<span style="opacity:.45">∅</span>'


def _value_text(field: str, value: float) -> str:
    s = f"{field}={value:+.4g}" if field != "loss_mask" else f"loss_mask={int(value)}"
    if FIELD_KINDS.get(field, ("",))[0] == "logprob" and math.isfinite(value):
        s += f" (p={math.exp(value):.3g})"
    return s


def legend_html(field: str, kind: str, low: float, high: float) -> str:
    if kind == "mask":
        desc = "green = trained on (loss_mask 1)"
        return (f'<div class="wb-legend"><b>{esc(field)}</b>: {desc} · '
                '<i style="color:#8a8a8a">grey italic</i> = not trained (prompt, observations, tool results, '
                'template, human turns)</div>')
    if kind == "diverging" and high <= low:  # every trained token sits at the centre
        return (f'<div class="wb-legend"><b>{esc(field)}</b>: all {low:g} on the trained tokens (no colour) · '
                '<i style="color:#8a8a8a">grey italic</i> = not trained</div>')
    lo_txt, hi_txt = f"{low:+.3g}", f"{high:+.3g}"
    note = {"diverging": "blue below, red above " + f"{(low + high) / 2:g}",
            "logprob": "purple = unlikely token", "sequential": "purple = high"}[kind]
    return (f'<div class="wb-legend"><b>{esc(field)}</b> {lo_txt}<span class="wb-bar" '
            f'style="background:{gradient_css("diverging" if kind == "diverging" else "sequential")}'
            f'{";transform:scaleX(-1)" if kind == "logprob" else ""}"></span>{hi_txt} ({note}; '
            'hover a token for its value) · <i style="color:#8a8a8a">grey italic</i> = not trained</div>')


def render_tokens_html(batch: TrajectoryBatch, index: int, field: str, tokenizer: Any = None,
                       scale: tuple[str, float, float] | str | None = None, texts: list[str] | None = None,
                       style: bool = True) -> str:
    """HTML of episode `index`'s tokens coloured by `field` (one span per token, value in its title).

    `scale`: "episode" (default: this episode's own range), "batch" (the whole batch's),
    or an explicit (kind, low, high).
    """
    batch.require(field)
    ep = batch.episodes[index]
    which = scale if isinstance(scale, str) else ("episode" if scale is None else "")
    if scale is None or isinstance(scale, str):
        if scale not in (None, *SCALES):
            raise ValueError(f"scale must be one of {SCALES} or (kind, low, high), not {scale!r}")
        scale = field_scale(batch, field, None if scale == "batch" else index)
    kind, low, high = scale
    values = batch.token_values(index, field)
    texts = texts if texts is not None else decode_tokens(tokenizer, ep.token_ids)
    reasoning = {p for t in ep.turns for p in range(t.token_start, t.token_start + t.reasoning_tokens)}
    spans = []
    for pos, (tok, text, value, m, turn) in enumerate(zip(ep.token_ids, texts, values, ep.loss_mask, ep.turn_index)):
        trained = bool(m)
        bg, fg = token_style(value, trained, kind, low, high)
        where = "prompt" if turn < 0 else f"turn {turn}"
        title = f"#{pos} id={tok} {text!r} · {_value_text(field, value)} · {where}, " + (
            "trained" if trained else "not trained") + (", reasoning" if pos in reasoning else "")
        cls = ("wb-tok" if trained else "wb-tok wb-untrained") + (" wb-reason" if pos in reasoning else "")
        bg_css = f"background:{bg};" if bg != "transparent" else ""
        spans.append(f'<span class="{cls}" style="{bg_css}color:{fg}" title="{esc(title)}">{_shown_text(text)}</span>')
    css = STYLE if style else ""
    version = f" · sampled by weights v{ep.weight_version}" if ep.weight_version is not None else ""
    head = (f'<div class="wb-head">episode {ep.episode_id} · {ep.num_tokens} tokens · '
            f'{ep.response_length} trained{version}</div>') + group_line_html(batch, index)
    if reasoning:
        head += '<div class="wb-legend">dotted underline: a reply\'s reasoning block (&lt;think&gt;…&lt;/think&gt;)</div>'
    if which and kind != "mask":
        head += (f'<div class="wb-legend">colour scale: {"this episode" if which == "episode" else "whole batch"}'
                 '</div>')
    label = field
    if field == "kl" and batch.meta.get("kl_estimator"):
        label = f"kl ({batch.meta['kl_estimator']} estimate)"  # which estimator produced these numbers
    recomputed = batch.meta.get("recomputed") or {}
    if field.startswith("recomputed_") and recomputed:  # a run imported as text, teacher-forced on a model
        against = f" vs {recomputed['ref_model']}" if field == "recomputed_kl" and recomputed.get("ref_model") else ""
        label = f"{field} (recomputed, not sampled: {recomputed.get('model')}{against})"
    return (f'{css}<div class="wb-root wb-tokens-body">{head}{legend_html(label, kind, low, high)}'
            f'<div class="wb-tokbox">{"<wbr>".join(spans)}</div></div>')  # a line may break between tokens


def _run_tokenizer(run: Any) -> Any:
    """A reopened run's tokenizer; None for an imported run that names no model (recorded token ids
    show as ids; a run recorded as text says it has no tokens), the error for any other run."""
    from workbench.debug.runs import RunError

    try:
        return run.tokenizer()
    except RunError:
        if getattr(run, "provenance", None) is not None:
            return None
        raise


class TokenView(widgets.VBox):
    """Tokens of one episode coloured by a per-token quantity, with a field dropdown.

    Args:
        batch: a `TrajectoryBatch`, a single `Episode`, or a `Run` (`workbench.debug.load_run`).
        tokenizer: decodes the ids (without it tokens show as ⟨id⟩; with a `Run`, the
            tokenizer of the run's model is loaded when none is given).
        field: quantity shown first; defaults to "advantages" if present, else the first available.
        index: episode shown first.
        scale: "episode" (each episode coloured on its own range) or "batch" (one range
            for the whole batch, so colours compare across episodes).
        step: with a `Run`, the saved step whose batch is shown (default: the last).
    """

    index = traitlets.Int(0, help="position of the shown episode in the batch")
    field = traitlets.Unicode("", help="per-token field used for the colours")
    scale = traitlets.Enum(SCALES, default_value="episode", help="colour range: this episode's or the batch's")

    def __init__(self, batch: TrajectoryBatch | Episode | Any, tokenizer: Any = None, field: str | None = None,
                 index: int = 0, scale: str = "episode", step: int | None = None, **kwargs: Any):
        if tokenizer is None and is_run(batch):
            tokenizer = _run_tokenizer(batch)
        self.tokenizer = tokenizer
        # The controls wrap onto a second line in a narrow column (e.g. two views side by
        # side) instead of being clipped.
        narrow = {"description_width": "initial"}
        self._pick = widgets.Dropdown(options=[], description="episode", style=narrow,
                                      layout=widgets.Layout(width="auto", min_width="200px", max_width="430px",
                                                            flex="1 1 260px"))
        self._field = widgets.Dropdown(options=[], description="colour by", style=narrow,
                                       layout=widgets.Layout(width="230px", min_width="230px"))
        self._scale = widgets.ToggleButtons(options=[("episode scale", "episode"), ("batch scale", "batch")],
                                            value=scale, style={"button_width": "auto"},
                                            tooltips=["colours span this episode's values",
                                                      "colours span the whole batch's values"])
        self._body = widgets.HTML()
        self._body.add_class("wb-tokens-html")
        controls = widgets.HBox([self._pick, self._field, self._scale],
                                layout=widgets.Layout(flex_flow="row wrap", width="100%"))
        controls.add_class("wb-tokens-controls")
        super().__init__([controls, self._body], **kwargs)
        self.add_class("wb-tokens")
        self._ready = False
        self.scale = scale
        self._pick.observe(lambda c: self._set_index(c["new"]), names="value")
        self._field.observe(lambda c: c["new"] and setattr(self, "field", c["new"]), names="value")
        self._scale.observe(lambda c: setattr(self, "scale", c["new"]), names="value")
        self._ready = False
        self.set_batch(batch, field=field, index=index, step=step)

    # -- public ----------------------------------------------------------------------
    @property
    def fields(self) -> list[str]:
        """Fields offered in the dropdown (those the batch has)."""
        return list(self._fields)

    @property
    def html(self) -> str:
        return self._body.value

    def set_batch(self, batch: TrajectoryBatch | Episode | Any, field: str | None = None, index: int = 0,
                  step: int | None = None) -> None:
        """Show another batch (or a `Run`'s step `step`); keeps the current field when the
        new batch has it."""
        batch = batch_of(batch, step)
        if isinstance(batch, Episode):
            batch = TrajectoryBatch([batch])
        absent = (batch.meta.get("absent") or {}).get("token_ids")
        if absent and not any(e.token_ids for e in batch.episodes):
            raise ValueError(f"no tokens to show: {absent}")
        self.batch = batch
        self._texts: dict[int, list[str]] = {}
        self._fields = available_fields(batch)
        want = field or (self.field if self.field in self._fields else None) or (
            "advantages" if "advantages" in self._fields else self._fields[0])
        if want not in self._fields:
            raise ValueError(f"field {want!r} is not in this batch; available: {self._fields}")
        self._ready = False
        with self.hold_trait_notifications():
            self._field.options = self._fields
            self._field.value = want
            labels = [(episode_label(i, ep), i) for i, ep in enumerate(batch.episodes)]
            self._pick.options = labels
            # wide enough for its longest label (its box and "episode" take ~90 px; ~7.5 px a character)
            longest = max((len(text) for text, _ in labels), default=20)
            self._pick.layout.min_width = f"{min(520, 90 + int(7.5 * longest))}px"
            self._pick.layout.max_width = f"{max(430, min(520, 90 + int(7.5 * longest)))}px"
            self.field = want
            self.index = max(0, min(index, len(batch) - 1))
            self._pick.value = self.index
        self._ready = True
        self._render()

    def values(self) -> list[float]:
        """Values of the current field for the shown episode."""
        return self.batch.token_values(self.index, self.field)

    # -- internals ---------------------------------------------------------------------
    def _set_index(self, value: int | None) -> None:
        if value is not None and value != self.index:
            self.index = value

    @traitlets.validate("field")
    def _check_field(self, proposal: dict) -> str:
        value = proposal["value"]
        if getattr(self, "_fields", None) and value not in self._fields:
            raise traitlets.TraitError(f"field {value!r} is not in this batch; available: {self._fields}")
        return value

    @traitlets.observe("index", "field", "scale")
    def _on_change(self, change: dict) -> None:
        if self._ready:
            self._render()

    def _render(self) -> None:
        if not len(self.batch):
            self._body.value = "<i>empty batch</i>"
            return
        i, f = self.index, self.field
        if i not in self._texts:
            self._texts[i] = decode_tokens(self.tokenizer, self.batch.episodes[i].token_ids)
        self._body.value = render_tokens_html(self.batch, i, f, self.tokenizer, self.scale, self._texts[i])
        if self._scale.value != self.scale:
            self._scale.value = self.scale
        if self._field.value != f:
            self._field.value = f
        if self._pick.value != i:
            self._pick.value = i

    def __repr__(self) -> str:
        return f"TokenView(episode {self.index}/{len(self.batch)}, field={self.field!r}, scale={self.scale!r}, fields={self._fields})"
