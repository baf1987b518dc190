# %% [markdown]
# # Bring your agent: train an OpenAI-client agent, look at its episodes, fork one
#
# An agent that talks to a model through the OpenAI API trains as it is. The gateway serves
# the policy on 127.0.0.1 and records every call's prompt ids, sampled ids and logprobs under
# the episode; `GatewayRollout` runs the agent many times at once and assembles each run into
# a token-exact episode, the same `Episode` our own rollouts make. This notebook:
#
# 1. writes a two-turn agent with the plain `openai` client (it never imports workbench);
# 2. runs it through the gateway on the embedded model and checks the episodes hold exactly
#    what the engine sampled;
# 3. opens an episode in the conversation and token views;
# 4. **forks** an episode at its second turn with a typed answer: the agent runs again, its
#    first call answered as recorded;
# 5. shows that a streaming client gets the same reply;
# 6. trains one GRPO step on the batch.

# %%
import os
import warnings

# Idle torch threads sleep instead of spinning: on a busy, shared CPU spinning threads
# fight each other and a forward pass can get up to 15x slower. Must be set before torch loads.
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
import torch
from transformers.utils import logging as hf_logging

SMOKE = os.environ.get("WORKBENCH_SMOKE") == "1"   # CI: smaller budgets, every cell still runs for real
torch.set_num_threads(int(os.environ.get("WORKBENCH_THREADS", 2)))
hf_logging.disable_progress_bar()
warnings.filterwarnings("ignore", category=FutureWarning)
print("smoke mode" if SMOKE else "full mode")

# %% [markdown]
# ## 1. The agent
#
# Plain `openai` client code: it asks for a sum, asks the model to check it, and scores the
# last answer (1 for the right number alone, 0.5 when the right number is somewhere in the
# reply, else 0). `base_url` already names the episode, so the agent needs no header.

# %%
import openai


def agent(base_url: str, episode_id: str, task: dict) -> float:
    client = openai.OpenAI(base_url=base_url, api_key="none", max_retries=0)
    messages = [{"role": "user", "content": f"What is {task['a']} + {task['b']}?"}]
    for follow_up in ("Check it, then reply with just the number.", None):
        reply = client.chat.completions.create(model="policy", messages=messages, max_tokens=24,
                                               temperature=task["temperature"])
        messages.append(reply.choices[0].message.model_dump(exclude_none=True))
        if follow_up:
            messages.append({"role": "user", "content": follow_up})
    answer = (reply.choices[0].message.content or "").strip().rstrip(".")
    right = str(task["a"] + task["b"])
    return 1.0 if answer == right else 0.5 if right in answer else 0.0


# %% [markdown]
# ## 2. Run it through the gateway
#
# The policy is the embedded SmolLM2-135M-Instruct with LoRA, as in the other notebooks.
# Each task is one GRPO group; `group_size` copies of the agent play it, all at once, so their
# calls share the engine's batches. `seed` makes the sampling repeat from run to run.

# %%
from workbench import ConfigStore, Trainer
from workbench.gateway import GatewayRollout

config = ConfigStore()
config.update("training", {"adv_estimator": "grpo", "learning_rate": 5e-4, "batch_size": 4 if SMOKE else 16,
                           "group_size": 2 if SMOKE else 4, "micro_batch_size": 4,
                           "use_kl_loss": False, "use_kl_in_reward": False})
config.checkpoint.save_interval = 0
trainer = Trainer(config)

tasks = [{"a": 7, "b": 5, "temperature": 0.8}, {"a": 12, "b": 9, "temperature": 0.8}]
if not SMOKE:
    tasks += [{"a": 3, "b": 14, "temperature": 0.8}, {"a": 18, "b": 6, "temperature": 0.8}]
rollout = GatewayRollout(trainer.engine, agent, tasks, group_size=config.training.group_size, max_turns=2, seed=2)
batch = rollout.run()
for ep in batch:
    print(f"episode {ep.episode_id} ({ep.group_id}): reward {ep.outcome:.1f} | "
          + " | ".join(repr(t.action[:40]) for t in ep.turns))
print({k: round(v, 2) for k, v in batch.meta.items()})

# %% [markdown]
# What was trained on is what was sampled: each episode's tokens with loss mask 1 are, turn by
# turn, the ids the engine returned for that call, and the context before them is the prompt the
# engine got. The gateway re-sends an earlier reply as its sampled ids (not re-tokenised text),
# so no episode needs an alignment warning.

# %%
# NBVAL_CHECK_OUTPUT
from workbench.rollout.chat import check_token_alignment

print("episodes:", len(batch), "| turns each:", sorted({ep.num_turns for ep in batch}))
print("episodes with an alignment warning:", int(batch.meta["gateway/misaligned_episodes"]))
print("every episode re-renders to its own ids:",
      all(check_token_alignment(ep, trainer.engine.tokenizer).ok for ep in batch))
trained = [sum(ep.loss_mask[t.token_start:t.token_end]) == t.token_end - t.token_start for ep in batch for t in ep.turns]
print("every sampled token is trained on, every prompt token is not:",
      all(trained) and sum(sum(ep.loss_mask) for ep in batch) == sum(ep.response_length for ep in batch))

# %% [markdown]
# ## 3. Look at an episode
#
# The views take a gateway batch like any other: the conversation with its reward, and every
# token coloured by its sampling logprob (after `compute_advantages`, by advantage or KL).

# %%
from workbench.widgets import ConversationView, TokenView

ConversationView(batch)

# %%
TokenView(batch, tokenizer=trainer.engine.tokenizer)

# %% [markdown]
# ## 4. Fork an episode at a turn
#
# `rollout.fork(episode, turn, action=...)` runs the agent again on the episode's task. The
# gateway answers its first `turn` calls with the recorded replies (each call must send the
# prompt it sent the first time, else a `ReplayMismatch` names the call), gives the typed
# action at `turn` (loss mask 0, marked "edited"), and samples anything after. Here the second
# turn of the first episode is replaced by the right answer, typed; the agent scores it 1.

# %%
from workbench.debug import fork

original = batch[0]
right = str(tasks[0]["a"] + tasks[0]["b"])
branches = fork(original, 1, action=right, n=2, engine=rollout)   # same as rollout.fork(original, 1, ...)
for b in branches:
    print(f"branch {b.episode_id}: reward {b.outcome:.1f} | "
          + " | ".join(f"{t.source}: {t.action[:40]!r}" for t in b.turns))

# %%
# NBVAL_CHECK_OUTPUT
cut = branches.meta["fork"]["token_position"]
print("tokens before the fork equal the original's:",
      all(b.token_ids[:cut] == original.token_ids[:cut] and b.loss_mask[:cut] == original.loss_mask[:cut]
          for b in branches))
print("turn sources:", [t.source for t in branches[0].turns], "| typed answer:", branches[0].turns[1].action == right)
print("rewards of the branches:", [b.outcome for b in branches])
print("the typed turn is not trained on:",
      all(set(b.loss_mask[b.turns[1].token_start:b.turns[1].token_end]) == {0} for b in branches))

# %% [markdown]
# ## 5. Streaming clients
#
# A harness that streams (`stream=True`) gets the same reply as OpenAI-style chunks. The
# gateway generates the whole reply first (batched with the other calls), so no token arrives
# early: this is for harnesses that only speak streaming.

# %%
# NBVAL_CHECK_OUTPUT
from workbench.gateway import Gateway

with Gateway(trainer.engine, max_tokens=24) as gateway:
    client = openai.OpenAI(base_url=gateway.base_url, api_key="none", max_retries=0)
    ask = dict(model="policy", messages=[{"role": "user", "content": "What is 7 + 5?"}], temperature=1.0, seed=3)
    plain = client.chat.completions.create(**ask).choices[0].message.content
    chunks = list(client.chat.completions.create(**ask, stream=True))
    streamed = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
print("chunks:", len(chunks), "| joined chunks equal the plain reply:", streamed == plain)

# %% [markdown]
# ## 6. Train on it
#
# The batch goes through the same `score`, `compute_advantages` and `update` as a rollout of
# our own environments: the agent's return value sits on the last turn as the reward. Run
# `benchmarks/bring_your_agent.py` for a whole run (docs/bring_your_agent.md quotes one: held-out reward
# 0.16 to 0.34 in 8 steps).

# %%
trainer.score(batch)
trainer.compute_advantages(batch)
before = {k: v.clone() for k, v in trainer.policy.trainable_state_dict().items()}
metrics = trainer.update(batch)
print("rewards by group:", {g: [ep.outcome for ep in batch if ep.group_id == g] for g in sorted({ep.group_id for ep in batch})})
print({k: round(metrics[k], 4) for k in ("actor/pg_loss", "actor/grad_norm", "actor/ppo_kl")})
changed = sum(not torch.equal(before[k], v) for k, v in trainer.policy.trainable_state_dict().items())
# The B half of each adapter moves; A gets no gradient while B is still all zeros (its start).
print(f"LoRA tensors changed by the update: {changed} of {len(before)}")
