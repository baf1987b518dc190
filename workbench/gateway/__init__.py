"""An OpenAI-compatible gateway to the policy, and rollouts of external agents through it.

    render.py    OpenAI chat requests -> prompt ids (re-sent replies as their sampled ids); replies -> messages
    server.py    `Gateway`: the HTTP API on 127.0.0.1 (FastAPI + uvicorn on a thread), calls recorded per episode
    grammars.py  a request's grammar: size limit, compiled on compile threads under a deadline, off the serving path
    stream.py    `stream=true`: a finished reply as OpenAI's server-sent event chunks
    assemble.py  an episode's recorded calls -> one token-exact `Episode`, alignment warnings where history broke
    rollout.py   `GatewayRollout`: N agents at once against the gateway -> `TrajectoryBatch` for the trainer

Needs `fastapi` and `uvicorn` (the `gateway` extra); agents usually use the `openai` client.
"""
from workbench.gateway.assemble import assemble_episode
from workbench.gateway.render import PromptBuilder, Reply, RequestError
from workbench.gateway.rollout import GatewayRollout
from workbench.gateway.server import CallRecord, Gateway

__all__ = ["Gateway", "GatewayRollout", "CallRecord", "PromptBuilder", "Reply", "RequestError", "assemble_episode"]
