"""The group LLM judge (`GroupJudge`, the `reward.group_judge` setting): a whole group of
episodes (the same environment seed) in one prompt, judged against each other, as ART's RULER
does: the messages every episode of the group opens with, up to the first reply (the system
prompt, the first observation), are sent once as the shared context, then each trajectory's
own messages from its first reply on, numbered; the reply gives a score and a reason per
trajectory.

    judge = GroupJudge("http://127.0.0.1:8000/v1")
    judge.judge(batch.episodes)                 # one Judgment per episode, in order (a request per group)
    judge.judge_groups([group], order_seed=1)   # the group shown in a shuffled order (the audit's position test)
    judge.messages(group)                       # the exact prompt of one group, in the order given

The reply is one line per trajectory, "k: x - reason" (or RULER's JSON); a trajectory the
reply gives no score for, or one outside the scale, fails on its own, the others keep theirs.
A request that fails fails the group's every episode. The group's request is counted once:
its tokens on the judgment of the group's first episode (in the batch's order), its seconds
on every one. The cache keeps a group's reply only when every trajectory got a score on the scale.
"""
from __future__ import annotations

import random
import zlib
from typing import Any

from workbench.reward.backends import Messages
from workbench.reward.judges import ChatJudge, reason_chars
from workbench.reward.judgments import Judgment, common_prefix, parse_group_scores, transcript


class GroupJudge(ChatJudge):
    """The group judge (module docstring); arguments as `ChatJudge`'s. `max_tokens` is per
    trajectory: a group of n gets n times as many."""

    source = "group_judge"

    def messages(self, group: list[Any]) -> Messages:
        """The exact chat messages sent for `group` (episodes in the order they are shown)."""
        lists = [list(ep.messages) for ep in group]
        k = common_prefix(lists)
        first_reply = min((next((i for i, m in enumerate(ms) if m.get("role") == "assistant"), len(ms))
                           for ms in lists), default=0)
        k = min(k, first_reply)  # the shared opening: every trajectory shows all of its own replies
        scale = self._scale_words()
        if self.json:
            form = ('Reply with a JSON object {"scores": [{"trajectory_id": k, "explanation": "<one sentence>", '
                    '"score": x}, ...]}, one entry per trajectory, in order (k is the trajectory\'s number, x its '
                    "score).")
            ask = f'Your scores as JSON {{"scores": [...]}} (x {scale}):'
        else:
            form = ("Reply with one line per trajectory, in order, of the form `k: x - reason` (k is the "
                    "trajectory's number, x its score), and nothing else.")
            ask = f"Your scores, one line per trajectory (`k: x - reason`, x {scale}):"
        system = (f"You are a careful, strict judge. You will see {len(group)} trajectories of an AI assistant, all "
                  f"starting from the same context. {self.rubric}\nCompare them and score each one {scale}; a "
                  f"better trajectory gets a higher score. {form}")
        parts = []
        if k:
            parts.append(f"The context every trajectory starts from:\n\n{transcript(lists[0][:k])}")
        for i, msgs in enumerate(lists, 1):
            rest = transcript(msgs[k:]) if msgs[k:] else "(nothing after the context)"
            parts.append(f"=== Trajectory {i} ===\n{rest}")
        parts.append(ask)
        return [{"role": "system", "content": system}, {"role": "user", "content": "\n\n".join(parts)}]

    def response_format(self, n: int = 1) -> dict[str, Any] | None:
        """The JSON schema of a group of `n`'s verdict (RULER's shape: one entry per trajectory, in
        order, each with its number, an explanation of bounded length and a score on the scale),
        or None without `json`."""
        if not self.json:
            return None
        low, high = self.scale

        def entry(k: int) -> dict[str, Any]:
            return {"type": "object", "properties": {
                "trajectory_id": {"const": k},
                "explanation": {"type": "string", "maxLength": reason_chars(self.max_tokens)},
                "score": {"type": "number", "minimum": low, "maximum": high}},
                "required": ["trajectory_id", "explanation", "score"], "additionalProperties": False}
        schema = {"type": "object", "properties": {"scores": {
            "type": "array", "prefixItems": [entry(k) for k in range(1, n + 1)], "items": False, "minItems": n,
            "maxItems": n}}, "required": ["scores"], "additionalProperties": False}
        return {"type": "json_schema", "json_schema": {"name": "group_verdict", "schema": schema}}

    @staticmethod
    def order(group: list[Any], seed: int | None) -> list[int]:
        """The order a group is shown in: as given (seed None), or a shuffle drawn from `seed`
        and the group's id (the same seed shuffles a group the same way every time)."""
        idx = list(range(len(group)))
        if seed is not None and len(group) > 1:
            gid = str(group[0].group_id)
            random.Random(seed * 1_000_003 + zlib.crc32(gid.encode())).shuffle(idx)
        return idx

    def judge_groups(self, groups: list[list[Any]], order_seed: int | None = None,
                     use_cache: bool | None = None) -> list[list[Judgment]]:
        """Judgments per group, aligned with each group's episodes as given (whatever order
        they were shown in); one request per group, all sent together."""
        orders = [self.order(g, order_seed) for g in groups]
        shown = [[g[i] for i in o] for g, o in zip(groups, orders)]
        requests = [self.messages(s) for s in shown]
        sizes = [max(len(g), 1) for g in groups]
        results: list[tuple[Any, bool]] = [None] * len(groups)  # type: ignore[list-item]
        for n in sorted(set(sizes)):  # groups of one size go together (same max_tokens and schema)
            rows = [i for i, m in enumerate(sizes) if m == n]
            for i, r in zip(rows, self.run([requests[i] for i in rows], max_tokens=self.max_tokens * n,
                                           use_cache=use_cache, response_format=self.response_format(n))):
                results[i] = r
        out = []
        for group, order, messages, (completion, cached), n in zip(groups, orders, requests, results, sizes):
            scores = parse_group_scores(completion.text, len(group)) if completion.text is not None else {}
            verdicts: list[Judgment | None] = [None] * len(group)
            for pos, ep_index in enumerate(order, 1):
                value, reason = scores.get(pos, (None, ""))
                j = self.verdict(value, reason, completion, cached, messages, what=f"the reply for trajectory {pos}")
                if j.failed and completion.text is not None and value is None:
                    asked = "a JSON entry" if self.json else "a line 'k: x - reason'"
                    j.error = (f"the group judge's reply gave no score for trajectory {pos} of {len(group)} "
                               f"(asked for {asked}): {completion.text.strip()[:160]!r}")
                j.position = pos
                verdicts[ep_index] = j
            for j in verdicts[1:]:  # one request: its tokens counted once
                j.prompt_tokens = j.completion_tokens = 0
            if not cached and all(not j.failed for j in verdicts):
                self.keep(messages, completion, max_tokens=self.max_tokens * n, response_format=self.response_format(n))
            out.append(verdicts)
        return out

    def judge(self, episodes: list[Any], order_seed: int | None = None,
              use_cache: bool | None = None) -> list[Judgment]:
        """One `Judgment` per episode, in the order given: episodes grouped by `group_id`."""
        rows: dict[str, list[int]] = {}
        for i, ep in enumerate(episodes):
            rows.setdefault(ep.group_id, []).append(i)
        groups = list(rows.values())
        out: list[Judgment | None] = [None] * len(episodes)
        for idx, verdicts in zip(groups, self.judge_groups([[episodes[i] for i in g] for g in groups],
                                                           order_seed, use_cache)):
            for i, j in zip(idx, verdicts):
                out[i] = j
        return out  # type: ignore[return-value]


__all__ = ["GroupJudge"]
