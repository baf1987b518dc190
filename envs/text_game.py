"""A small room adventure: the seeds' "Simple Text Game" made playable.

Three rooms in a row. You start in the first one with a key on the floor and a
locked door; behind it a weapon hangs on the wall; further on a monster blocks the
way. The winning plan is

    take key -> open door -> go <d1> -> take <weapon> -> go <d2> -> attack <monster>

Room names, door directions, weapon and monster are drawn from `self.rng`, so each
seed is a slightly different map (the plan has the same shape).

Action: free text, parsed leniently and case-insensitively: the first verb in the
reply (take/get/grab/pick, open/unlock, go/move/walk/head, attack/fight/kill/hit,
look, inventory) plus any object or direction word; a direction alone means "go".

Strict format (`environment.strict_format=true`): the reply must be the command alone:
letters and spaces, at most 4 words, starting with a verb or direction and ending with a
word the command reads (a verb, a direction, key, door, the weapon or the monster), e.g.
"take key", "go north", "attack troll"; whitespace around it allowed. "I take the key",
"take key." or "go north now" is a format error: nothing happens, the reward is
`invalid_reward`, `info` has `invalid_action` and `parse_error`, and the turn counts
toward `max_steps`.

Rewards (defaults in `TextGameEnv.DEFAULT_PARAMS`): each first-time milestone (take
key, open door, take weapon, reach the monster) gives `progress_reward` (0.1);
defeating the monster gives `win_reward` (1.0), `info["success"] = True`, and ends
the episode; an action that does nothing (wrong direction, attacking without a
weapon, taking what is not there) costs `useless_penalty` (0.05); a reply with no
known verb or direction is `invalid_reward` (-0.1), `info["invalid_action"] = True`.
`look` and `inventory` are free. Default budget: 12 steps (the plan needs 6).
"""
from __future__ import annotations

import random
import re
from typing import Any

from envs._common import ParamsEnvironment, strict_span, word_spans, words
from workbench.environments.base import StepResult

VERBS: dict[str, str] = {
    "take": "take", "get": "take", "grab": "take", "pick": "take", "collect": "take",
    "open": "open", "unlock": "open",
    "go": "go", "move": "go", "walk": "go", "head": "go", "run": "go", "enter": "go",
    "attack": "attack", "fight": "attack", "kill": "attack", "hit": "attack", "slay": "attack",
    "strike": "attack",
    "look": "look", "examine": "look",
    "inventory": "inventory", "inv": "inventory",
}
COMPASS = ("north", "south", "east", "west")
OPPOSITE = {"north": "south", "south": "north", "east": "west", "west": "east"}
_DIRECTION_WORDS = {"north": "north", "south": "south", "east": "east", "west": "west",
                    "up": "north", "down": "south", "right": "east", "left": "west",
                    "forward": None, "back": None}


_COMMAND_RE = re.compile(r"[A-Za-z]+(?:[ \t]+[A-Za-z]+){0,3}")


def _a(noun: str) -> str:
    """`noun` with its indefinite article ("an axe", "a sword")."""
    return ("an " if noun[0] in "aeiou" else "a ") + noun


class TextGameEnv(ParamsEnvironment):
    """Take the key, open the door, get the weapon, defeat the monster."""

    NAME = "text_game"
    DEFAULT_MAX_STEPS = 12
    supports_strict_format = True
    DEFAULT_PARAMS: dict[str, Any] = {
        "progress_reward": 0.1,   # first time: take key, open door, take weapon, reach monster
        "win_reward": 1.0,        # defeat the monster
        "useless_penalty": 0.05,  # subtracted for an action that changes nothing
        "invalid_reward": -0.1,   # reply without a known verb or direction
    }

    def __init__(self, config=None):
        super().__init__(config)
        self._new_world(random.Random(0))  # placeholder world; reset() draws from self.rng

    def default_prompt(self) -> str:
        return (
            "You are playing a text adventure. Reply with one short command such as "
            "'take key', 'open door', 'go north' or 'attack troll'. Find a weapon and "
            "defeat the monster to win." + (" Reply with the command only, nothing else." if self.strict_format else "")
        )

    # -- world -----------------------------------------------------------------
    def _new_world(self, rng: random.Random) -> None:
        self.rooms = [rng.choice(["cellar", "storeroom", "dungeon cell"]),
                      rng.choice(["armory", "great hall", "guard room"]),
                      rng.choice(["throne room", "dark cave", "courtyard"])]
        self.d1 = rng.choice(COMPASS)
        self.d2 = rng.choice([d for d in COMPASS if d != OPPOSITE[self.d1]])
        self.key_name = rng.choice(["rusty", "brass", "iron"]) + " key"
        self.weapon = rng.choice(["sword", "axe", "spear"])
        self.monster = rng.choice(["troll", "goblin", "ogre"])
        self.room = 0
        self.inventory: list[str] = []
        self.items = {0: ["key"], 1: [self.weapon], 2: []}
        self.door_open = False
        self.milestones: set[str] = set()

    def exits(self) -> dict[str, int]:
        """Direction -> room index reachable from the current room (doors ignored)."""
        return {0: {self.d1: 1}, 1: {OPPOSITE[self.d1]: 0, self.d2: 2}, 2: {OPPOSITE[self.d2]: 1}}[self.room]

    def describe_room(self) -> str:
        """One or two sentences about the current room."""
        name = self.rooms[self.room]
        if self.room == 0:
            key = f" {_a(self.key_name).capitalize()} lies on the floor." if "key" in self.items[0] else ""
            door = "an open" if self.door_open else "a locked"
            return f"You are in the {name}.{key} There is {door} door to the {self.d1}."
        if self.room == 1:
            weapon = f" {_a(self.weapon).capitalize()} hangs on the wall." if self.weapon in self.items[1] else ""
            return (f"You are in the {name}.{weapon} Exits: {OPPOSITE[self.d1]} (back), "
                    f"{self.d2}.")
        return (f"You are in the {name}. {_a(self.monster).capitalize()} blocks your way! "
                f"Exit: {OPPOSITE[self.d2]} (back).")

    # -- parsing -------------------------------------------------------------------
    @staticmethod
    def parse(action: str) -> tuple[str | None, list[str], str | None]:
        """(verb, lower-case words, direction) of a reply; verb None if none found."""
        tokens = [w.lower() for w in words(action)]
        verb = next((VERBS[t] for t in tokens if t in VERBS), None)
        direction = next((_DIRECTION_WORDS[t] for t in tokens
                          if t in _DIRECTION_WORDS and _DIRECTION_WORDS[t]), None)
        if verb is None and direction is not None:
            verb = "go"
        return verb, tokens, direction

    def command_span(self, action: str) -> list[int] | None:
        """[start, end] of the command in a reply: from its first verb or direction word
        through the last word the command reads (a verb, direction, "key", "door", the
        weapon or the monster), or None when the reply has no verb or direction."""
        nouns = {"key", "door", self.weapon, self.monster, *self.key_name.split()}
        read = [(w.lower(), a, b) for w, a, b in word_spans(action)
                if w.lower() in VERBS or _DIRECTION_WORDS.get(w.lower()) or w.lower() in nouns]
        starts = [a for w, a, _ in read if w in VERBS or _DIRECTION_WORDS.get(w)]
        return [starts[0], read[-1][2]] if starts else None

    # -- episode -----------------------------------------------------------------
    def reset(self) -> str:
        """Draw a new map and describe the first room."""
        self._new_world(self.rng)
        return "Welcome to the adventure! " + self.describe_room()

    def _progress(self, milestone: str) -> float:
        if milestone in self.milestones:
            return 0.0
        self.milestones.add(milestone)
        return float(self.params["progress_reward"])

    def step(self, action: str) -> StepResult:
        """Apply one command; see the module docstring for the rewards."""
        if self.strict_format:
            bare = strict_span(action)[0]
            if not (_COMMAND_RE.fullmatch(bare) and self.command_span(bare) == [0, len(bare)]):
                return self.format_error(
                    "the reply is not a command alone",
                    "Reply with only a short command such as 'take key', 'open door', 'go north' or 'attack'. "
                    "Nothing happened.", f"\n{self.describe_room()}")
        verb, tokens, direction = self.parse(action)
        useless = -float(self.params["useless_penalty"])
        info: dict[str, Any] = {"success": False, "verb": verb}
        if verb is not None:
            info["action_span"] = self.command_span(action)
        if verb is None:
            info["invalid_action"] = True
            msg = "I don't understand. Try 'take key', 'open door', 'go north' or 'attack'."
            return f"{msg}\n{self.describe_room()}", float(self.params["invalid_reward"]), False, info

        reward = useless
        if verb == "look":
            msg, reward = self.describe_room(), 0.0
            return msg, reward, False, info
        if verb == "inventory":
            held = ", ".join(self.inventory) or "nothing"
            return f"You carry: {held}.", 0.0, False, info
        if verb == "take":
            here = self.items[self.room]
            named = [i for i in here if i in tokens]
            mentions_other = any(t in ("key", self.weapon, self.monster, "door") for t in tokens)
            target = named[0] if named else (here[0] if here and not mentions_other else None)
            if target:
                here.remove(target)
                self.inventory.append(target)
                reward = self._progress(f"take {target}")
                shown = self.key_name if target == "key" else target
                msg = f"You take the {shown}."
            else:
                msg = "There is nothing like that to take here."
        elif verb == "open":
            if self.room != 0 or self.door_open:
                msg = "There is no locked door here."
            elif "key" not in self.inventory:
                msg = "The door is locked. You need a key."
            else:
                self.door_open = True
                reward = self._progress("open door")
                msg = f"You unlock the door with the {self.key_name}. It swings open."
        elif verb == "go":
            target = self.exits().get(direction or "")
            if direction is None:
                msg = "Go where? Say a direction: north, south, east or west."
            elif target is None:
                msg = f"You cannot go {direction} from here."
            elif self.room == 0 and not self.door_open:
                msg = "The door is locked."
            else:
                self.room = target
                reward = self._progress("reach monster") if target == 2 else 0.0
                msg = f"You go {direction}."
        else:  # attack
            if self.room != 2:
                msg = "There is nothing to attack here."
            elif self.weapon not in self.inventory:
                msg = f"You punch the {self.monster}. It laughs and shoves you back. You need a weapon."
            else:
                self._done = True
                info["success"] = True
                msg = f"You strike the {self.monster} with your {self.weapon}. It flees. You win!"
                return msg, float(self.params["win_reward"]), True, info
        return f"{msg}\n{self.describe_room()}", reward, False, info

    def get_state_description(self) -> str:
        """The current room and inventory."""
        held = ", ".join(self.inventory) or "nothing"
        return f"{self.describe_room()} You carry: {held}."

    def expert_action(self) -> str:
        """The scripted expert's reply in the current state (`expert_action` below): what
        SFT warm-up learns from (`workbench.training.sft`)."""
        return expert_action(self)


def expert_action(env: TextGameEnv) -> str:
    """The winning command for the current state (follows the plan, recovers if off it)."""
    if env.room == 0:
        if "key" not in env.inventory:
            return "take key"
        return "open door" if not env.door_open else f"go {env.d1}"
    if env.room == 1:
        return f"take {env.weapon}" if env.weapon not in env.inventory else f"go {env.d2}"
    return f"attack {env.monster}" if env.weapon in env.inventory else f"go {OPPOSITE[env.d2]}"
