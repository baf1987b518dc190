"""Grid navigation: walk the agent A to the goal G around walls #.

The map is a small square grid drawn as text rows, row 1 on top:

    A . # .
    . . # .
    . # . .
    . . . G

Each seed draws walls, start and goal from `self.rng`; a breadth-first search makes
sure the goal is reachable (maps are redrawn until it is), so every seed is solvable.

Action: any text with a direction word: up/down/left/right (or north/south/west/east,
any case, anywhere in the reply); a reply of a single letter u/d/l/r also works.

Strict format (`environment.strict_format=true`): the reply must be one of the words
up, down, left, right (any case, whitespace around it allowed). Anything else ("Go up.",
"north", "u") is a format error: the agent stays put, the reward is `invalid_reward`,
`info` has `invalid_action` and `parse_error`, and the turn counts toward `max_steps`.

Rewards (defaults in `GridEnv.DEFAULT_PARAMS`): reaching G gives `goal_reward` (1.0)
and ends the episode with `info["success"] = True`; every other move costs
`step_penalty` (0.05), bumping into a wall or the edge too (the agent stays put and the
observation says so); a reply with no direction is `invalid_reward` (-0.1) with
`info["invalid_action"] = True`. Default budget: 12 steps.
"""
from __future__ import annotations

from collections import deque
from typing import Any

from envs._common import ParamsEnvironment, find_direction_span, strict_span
from workbench.engines.constraints import Constraint
from workbench.environments.base import StepResult

Cell = tuple[int, int]  # (row, col), 0-based
MOVES: dict[str, Cell] = {"up": (-1, 0), "down": (1, 0), "left": (0, -1), "right": (0, 1)}


def shortest_path(size: int, walls: set[Cell], start: Cell, goal: Cell) -> list[str] | None:
    """The moves of a shortest path from `start` to `goal` (BFS), or None if unreachable."""
    previous: dict[Cell, tuple[Cell, str] | None] = {start: None}
    queue = deque([start])
    while queue:
        cell = queue.popleft()
        if cell == goal:
            moves: list[str] = []
            while previous[cell] is not None:
                cell, move = previous[cell]  # type: ignore[misc]
                moves.append(move)
            return moves[::-1]
        for move, (dr, dc) in MOVES.items():
            nxt = (cell[0] + dr, cell[1] + dc)
            if 0 <= nxt[0] < size and 0 <= nxt[1] < size and nxt not in walls and nxt not in previous:
                previous[nxt] = (cell, move)
                queue.append(nxt)
    return None


class GridEnv(ParamsEnvironment):
    """Navigate a seeded size x size grid to the goal."""

    NAME = "grid"
    DEFAULT_MAX_STEPS = 12
    supports_strict_format = True
    DEFAULT_PARAMS: dict[str, Any] = {
        "size": 4,             # the grid is size x size
        "n_walls": 3,          # wall cells drawn per map
        "min_distance": 2,     # shortest start->goal path has at least this many moves
        "goal_reward": 1.0,    # reward for stepping onto G
        "step_penalty": 0.05,  # cost of every other move (bumps included)
        "invalid_reward": -0.1,  # reward for a reply without a direction
    }

    def __init__(self, config=None):
        super().__init__(config)
        self.size = int(self.params["size"])
        if self.size < 2:
            raise ValueError(f"grid: params size must be >= 2, got {self.size}")
        if int(self.params["n_walls"]) > self.size * self.size - 2:
            raise ValueError("grid: params n_walls leaves no room for the agent and the goal")
        self.walls: set[Cell] = set()
        self.agent: Cell = (0, 0)
        self.goal: Cell = (self.size - 1, self.size - 1)

    def default_prompt(self) -> str:
        return (
            "You move the agent A on a grid to reach the goal G. # is a wall, . is free. "
            "Row 1 is the top row. Reply with one word: up, down, left or right"
            + (", and nothing else." if self.strict_format else ".")
        )

    # -- map ---------------------------------------------------------------------
    def _draw_map(self) -> None:
        """Draw walls, start and goal until the goal is reachable and far enough."""
        cells = [(r, c) for r in range(self.size) for c in range(self.size)]
        n_walls = int(self.params["n_walls"])
        min_distance = min(int(self.params["min_distance"]), 2 * (self.size - 1))
        for _ in range(1000):
            chosen = self.rng.sample(cells, n_walls + 2)
            start, goal, walls = chosen[0], chosen[1], set(chosen[2:])
            path = shortest_path(self.size, walls, start, goal)
            if path is not None and len(path) >= min_distance:
                self.agent, self.goal, self.walls = start, goal, walls
                return
        raise RuntimeError("grid: could not draw a solvable map; lower n_walls or min_distance")

    def render(self) -> str:
        """The grid as text rows, cells separated by spaces."""
        rows = []
        for r in range(self.size):
            row = []
            for c in range(self.size):
                cell = (r, c)
                row.append("A" if cell == self.agent else "G" if cell == self.goal
                           else "#" if cell in self.walls else ".")
            rows.append(" ".join(row))
        return "\n".join(rows)

    def _where(self) -> str:
        (ar, ac), (gr, gc) = self.agent, self.goal
        return f"You are at row {ar + 1}, column {ac + 1}. The goal is at row {gr + 1}, column {gc + 1}."

    # -- episode -----------------------------------------------------------------
    def reset(self) -> str:
        """Draw a new solvable map and show it."""
        self._draw_map()
        return f"{self.render()}\n{self._where()}"

    def action_constraint(self) -> Constraint:
        """One of the four moves as a grammar (`environment.constrained_decoding`)."""
        return Constraint.choice(list(MOVES))

    def step(self, action: str) -> StepResult:
        """Move one cell; see the module docstring for the rewards."""
        if self.strict_format:
            bare, span = strict_span(action)
            move = bare.lower() if bare.lower() in MOVES else None
            if move is None:
                return self.format_error("the reply is not one of up, down, left, right",
                                         "Reply with only one word: up, down, left or right. You did not move.",
                                         f"\n{self.render()}")
        else:
            move, span = find_direction_span(action)
        if move is None:
            obs = f"No direction found. Reply with up, down, left or right.\n{self.render()}"
            return obs, float(self.params["invalid_reward"]), False, {"invalid_action": True}
        dr, dc = MOVES[move]
        nxt = (self.agent[0] + dr, self.agent[1] + dc)
        info: dict[str, Any] = {"move": move, "success": False, "action_span": span}
        if not (0 <= nxt[0] < self.size and 0 <= nxt[1] < self.size):
            note = f"You bumped into the edge moving {move}."
            info["bump"] = True
        elif nxt in self.walls:
            note = f"You bumped into a wall moving {move}."
            info["bump"] = True
        else:
            self.agent = nxt
            if nxt == self.goal:
                info["success"] = True
                self._done = True
                return f"You moved {move} and reached the goal!", float(self.params["goal_reward"]), True, info
            note = f"You moved {move}."
        return f"{note}\n{self.render()}\n{self._where()}", -float(self.params["step_penalty"]), False, info

    def get_state_description(self) -> str:
        """The current map and positions."""
        return f"{self.render()}\n{self._where()}"

    def expert_action(self) -> str:
        """The scripted expert's reply in the current state (`expert_action` below): what
        SFT warm-up learns from (`workbench.training.sft`)."""
        return expert_action(self)


def expert_action(env: GridEnv) -> str:
    """The first move of a BFS shortest path from the agent to the goal."""
    path = shortest_path(env.size, env.walls, env.agent, env.goal)
    return path[0] if path else "up"
