"""A wrapped environment's own global random state: `GlobalRNGScope`.

Many third-party text suites seed Python's `random` and numpy's global state in `reset` and
draw from it in `step` (`random.choice(WORDS)`, `np.random.randint(...)`). Wrapped as they
are, such an environment fails `check_env`'s global-RNG check (it reseeds and draws from state
the rest of the process shares), and when a rollout steps several environments side by side
in threads, one episode can draw numbers another episode's seed put there: two episodes of
one seed then differ.

An adapter that calls into third-party code runs every call under its own scope:

    self._rng = GlobalRNGScope()
    with self._rng.active(seed=seed):   # reset(seed): the scope's state starts from that seed
        obs, info = self.gym_env.reset(seed=seed)
    with self._rng.active():            # step: continues the scope's own state
        ... = self.gym_env.step(action)

Inside `active`, `random` and `numpy.random` (the legacy global `RandomState`) hold this
scope's state; on the way out the scope keeps what the call left there and puts the caller's
state back, exactly. Scopes of all environments take one process-wide lock for the length of
a call, so calls of wrapped environments in different threads never interleave on the global
state (they run one at a time; the workbench's own environments draw from `self.rng` and are
not serialised). `torch`'s global generator and numpy's `default_rng()` generators (which
are not global) are left alone.
"""
from __future__ import annotations

import contextlib
import random
import threading
from typing import Any, Iterator

#: One lock for every scope: the global states are one per process.
_LOCK = threading.RLock()


def _numpy() -> Any:
    try:
        import numpy
    except ImportError:  # numpy is a dependency; a stripped environment still works for `random`
        return None
    return numpy


class GlobalRNGScope:
    """The global `random` / `numpy.random` state one wrapped environment sees (module docstring).

    Args:
        seed: the state's starting seed (None: drawn once from the OS, as `random.Random()` is).
    """

    def __init__(self, seed: int | None = None):
        self._py: Any = None
        self._np: Any = None
        self.reseed(seed)

    def reseed(self, seed: int | None) -> None:
        """Start this scope's state afresh from `seed` (`random.seed(seed)` and
        `numpy.random.seed(seed mod 2**32)`, as a suite seeding itself would)."""
        py = random.Random(seed)
        self._py = py.getstate()
        np = _numpy()
        if np is not None:
            np_seed = py.getrandbits(32) if seed is None else int(seed) % 2**32
            self._np = np.random.RandomState(np_seed).get_state(legacy=True)

    @contextlib.contextmanager
    def active(self, seed: int | None = None) -> Iterator[None]:
        """Run the block with this scope's global state (reseeded from `seed` first when given)."""
        with _LOCK:
            if seed is not None:
                self.reseed(seed)
            np = _numpy()
            outer_py = random.getstate()
            outer_np = np.random.get_state(legacy=True) if np is not None else None
            random.setstate(self._py)
            if np is not None:
                np.random.set_state(self._np)
            try:
                yield
            finally:
                self._py = random.getstate()
                random.setstate(outer_py)
                if np is not None:
                    self._np = np.random.get_state(legacy=True)
                    np.random.set_state(outer_np)

    def __getstate__(self) -> dict[str, Any]:  # deep copies and pickles carry the state along
        return {"_py": self._py, "_np": self._np}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
