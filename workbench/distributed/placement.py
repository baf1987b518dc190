"""Ray placement: reserve every rollout worker's and learner's resources before any actor
starts, or fail fast saying why; and name an actor that dies while starting.

    placement = reserve(config)                   # one placement group, or PlacementError
    opts = placement.options("learner", rank)     # scheduling options of that bundle
    actor = cls.options(**opts).remote(...)
    wait_started([("learner 0", actor)])          # ActorStartError naming actor and cause

What is asked (`demands`): one bundle per rollout worker (`ray.num_actors`) and per
learner (`ray.num_learners`). GPUs per bundle come from `ray.num_gpus_per_actor` /
`ray.num_gpus_per_learner` (which `workbench.verl_compat.ray_groups_from_pools` sets
from verl's placement table). CPUs per bundle: `ray.num_cpus_per_actor` /
`ray.num_cpus_per_learner`, whose None is 1, or the cluster's free CPUs shared out
evenly when it has fewer than rollout workers + learners: on a 2-core laptop the
README's 2 workers + 2 learners get 0.5 CPU each. They mostly wait on each other (workers sample
while learners idle, then the other way round), so a fraction costs little time.

All bundles go into one placement group (strategy PACK: on one node when they fit). A
local cluster the workbench starts cannot grow, so a demand beyond its total fails at
once (before Ray is even started, when the workbench would start it: the machine's CPU
and GPU counts are what that cluster would have); on a cluster joined by `ray.address`
(which may autoscale) the reservation waits up to `ray.placement_timeout_s`. Either way the `PlacementError` names what was asked,
what the cluster has and the settings to change, instead of an actor waiting forever in
Ray's queue.

Environment code: `ship_modules` registers the modules of the user's environment,
tools and parser for pickling by value when the workers could not import them (a module
found only through a folder the driver put on `sys.path`, e.g. a notebook's folder), so
they reach the workers; an import that still fails on a worker becomes an
`ActorStartError` that says how to make the module importable.

Simplified: memory is not reserved (Ray's `memory` resource is opt-in and the model
size is not known before loading); one placement group per `reserve` call.
"""
from __future__ import annotations

import logging
import os
import sys
import sysconfig
import uuid
from dataclasses import dataclass
from typing import Any, Iterable, Sequence

RAY_INSTALL_COMMAND = 'pip install "ray[default]>=2.9"'

#: Roles of the bundles, in the order they appear in the placement group.
ROLES = ("rollout worker", "learner")
#: The config fields that set each role's count, CPUs and GPUs (named in errors).
ROLE_FIELDS = {
    "rollout worker": ("ray.num_actors", "ray.num_cpus_per_actor", "ray.num_gpus_per_actor"),
    "learner": ("ray.num_learners", "ray.num_cpus_per_learner", "ray.num_gpus_per_learner"),
}


def require_ray(who: str = "Ray rollout workers") -> Any:
    """The `ray` module, or an ImportError that names `who` needs it and gives the install command."""
    try:
        import ray
    except ImportError as exc:
        raise ImportError(f"{who} need Ray, which is not installed: {RAY_INSTALL_COMMAND} "
                          "(or set ray.use_ray=False to run in this process)") from exc
    return ray


class PlacementError(RuntimeError):
    """Ray cannot reserve the resources the configured groups need."""


class ActorStartError(RuntimeError):
    """A Ray actor died while it was starting (an import error, out of memory, ...)."""


@dataclass
class Demand:
    """What one role asks for: `count` bundles of `cpus` CPUs and `gpus` GPUs each."""

    role: str
    count: int
    cpus: float
    gpus: float

    def bundle(self) -> dict[str, float]:
        out = {"CPU": self.cpus}
        if self.gpus > 0:
            out["GPU"] = self.gpus
        return out

    def __str__(self) -> str:
        gpu = f", {self.gpus:g} GPU" if self.gpus else ""
        return f"{self.count} {self.role}{'s' if self.count != 1 else ''} x ({self.cpus:g} CPU{gpu})"


def learner_gpus(config: Any) -> float:
    """GPUs per learner: `ray.num_gpus_per_learner`, whose None is 1 on CUDA, else 0."""
    value = config.ray.num_gpus_per_learner
    if value is not None:
        return float(value)
    import torch

    return float(torch.cuda.is_available())


def fair_cpu_share(cluster_cpus: float, actors: int) -> float:
    """1 CPU per actor, or `cluster_cpus / actors` (floored to 1/100) when that is less."""
    if actors <= 0 or cluster_cpus >= actors:
        return 1.0
    return max(int(cluster_cpus / actors * 100) / 100, 0.01)


def demands(config: Any, cluster_cpus: float, num_actors: int | None = None,
            num_learners: int | None = None) -> list[Demand]:
    """The bundles the configured groups need on a cluster with `cluster_cpus` free CPUs
    (`num_actors` / `num_learners` override the config's counts; 0 leaves a role out)."""
    r = config.ray
    n_act = r.num_actors if num_actors is None else num_actors
    n_learn = r.num_learners if num_learners is None else num_learners
    share = fair_cpu_share(cluster_cpus, n_act + n_learn)
    out = []
    if n_act:
        out.append(Demand("rollout worker", n_act, r.num_cpus_per_actor or share, float(r.num_gpus_per_actor or 0)))
    if n_learn:
        out.append(Demand("learner", n_learn, r.num_cpus_per_learner or share, learner_gpus(config)))
    return out


def _cuda_devices() -> int:
    import torch

    return torch.cuda.device_count() if torch.cuda.is_available() else 0


#: Local Ray starts tried before the error is raised (`start_ray`).
RAY_START_ATTEMPTS = 3


def start_ray(address: str | None = None, **options: Any) -> Any:
    """Start Ray, or join the cluster at `address`, and return the `ray` module.

    The defaults are what the workbench runs with: no dashboard, workers' logs not copied to the
    driver, Ray's own messages from WARNING up (its INFO lines would fill a notebook's stderr), and
    the driver's `OMP_WAIT_POLICY` (PASSIVE by default) in every worker. `options` go to
    `ray.init` (e.g. `num_cpus`) and replace those defaults.

    Ray gives a new local node's raylet a fixed 30 s to register ("The current node timed out
    during startup"); a machine busy with other work can pass that, so a local start that fails
    this way is shut down and tried again, `RAY_START_ATTEMPTS` times in all."""
    ray = require_ray("Ray rollout workers and learners (ray.use_ray)")
    if ray.is_initialized():
        return ray
    kwargs: dict[str, Any] = dict(include_dashboard=False, log_to_driver=False, logging_level=logging.WARNING,
                                  runtime_env={"env_vars": {"OMP_WAIT_POLICY": os.environ.get("OMP_WAIT_POLICY",
                                                                                              "PASSIVE")}})
    kwargs.update(options)
    for attempt in range(1, RAY_START_ATTEMPTS + 1):
        try:
            ray.init(address=address, **kwargs)
            return ray
        except Exception as exc:  # noqa: BLE001 (Ray raises a bare Exception for this)
            if address is not None or "timed out during startup" not in str(exc) or attempt == RAY_START_ATTEMPTS:
                raise
            logging.getLogger(__name__).warning("Ray's local node did not start in time (attempt %d of %d); "
                                                "starting it again", attempt, RAY_START_ATTEMPTS)
            ray.shutdown()
    return ray


def ensure_ray(config: Any) -> Any:
    """The `ray` module, with Ray started (`ray.address`: None starts a local cluster of
    this machine's CPUs; an address joins that cluster; `start_ray`)."""
    return start_ray(config.ray.address)


def _totals(asked: Sequence[Demand]) -> dict[str, float]:
    cpus = sum(d.count * d.cpus for d in asked)
    gpus = sum(d.count * d.gpus for d in asked)
    return {"CPU": cpus, "GPU": gpus}


def _describe(resources: dict[str, float]) -> str:
    return ", ".join(f"{resources.get(k, 0):g} {k}" for k in ("CPU", "GPU"))


def placement_error(asked: Sequence[Demand], total: dict[str, float], available: dict[str, float],
                    why: str, where: str = "the cluster") -> PlacementError:
    """The error for a demand the cluster cannot hold: what was asked, what there is, what to set."""
    need = _totals(asked)
    short = [k for k in ("CPU", "GPU") if need[k] > total.get(k, 0) + 1e-9] or ["CPU", "GPU"]
    fields = []
    for d in asked:
        count, cpus, gpus = ROLE_FIELDS[d.role]
        if "CPU" in short or "GPU" in short and d.gpus:
            fields.append(count)
        if "CPU" in short:
            fields.append(cpus)
        if "GPU" in short and d.gpus:
            fields.append(gpus)
    hint = ", ".join(dict.fromkeys(fields))
    gpu_note = (" (on a machine without GPUs set ray.num_gpus_per_learner=0 and ray.num_gpus_per_actor=0)"
                if "GPU" in short and not total.get("GPU") else "")
    return PlacementError(
        f"Ray cannot place the rollout workers and learners: {why}. Asked for "
        f"{' + '.join(str(d) for d in asked)} = {_describe(need)}; {where} has {_describe(total)} "
        f"({_describe(available)} free). Lower {hint}{gpu_note}, or join a larger cluster with ray.address.")


class Placement:
    """One Ray placement group holding a bundle per rollout worker and per learner."""

    def __init__(self, group: Any, asked: Sequence[Demand]):
        self.group, self.asked = group, list(asked)
        self._first: dict[str, int] = {}
        index = 0
        for d in self.asked:
            self._first[d.role] = index
            index += d.count

    def demand(self, role: str) -> Demand:
        return next(d for d in self.asked if d.role == role)

    def options(self, role: str, index: int) -> dict[str, Any]:
        """`actor_cls.options(**...)` for bundle `index` of `role`: its CPUs and GPUs and a
        scheduling strategy that puts the actor into that bundle."""
        from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

        d = self.demand(role)
        if not 0 <= index < d.count:
            raise IndexError(f"{role} {index}: the placement holds {d.count}")
        return {"num_cpus": d.cpus, "num_gpus": d.gpus, "scheduling_strategy": PlacementGroupSchedulingStrategy(
            self.group, placement_group_bundle_index=self._first[role] + index)}

    def remove(self) -> None:
        """Give the reserved resources back to Ray."""
        from ray.util.placement_group import remove_placement_group

        if self.group is not None:
            try:
                remove_placement_group(self.group)
            except Exception:  # noqa: BLE001 - Ray already down
                pass
            self.group = None

    def __repr__(self) -> str:
        return f"Placement({' + '.join(str(d) for d in self.asked)})"


def check_fits(config: Any, num_actors: int | None = None, num_learners: int | None = None) -> None:
    """Raise `PlacementError` now if the configured groups cannot fit what Ray has or would
    have, reserving nothing and starting nothing (`Trainer` calls it before loading any
    model): with Ray not started and no `ray.address` / `RAY_ADDRESS`, the cluster
    `ray.init` would start has this machine's CPUs and GPUs; a running local cluster has
    its totals. A cluster joined by address may grow, so it is left to `reserve`'s wait."""
    ray = require_ray("Ray rollout workers and learners (ray.use_ray)")
    joined = config.ray.address is not None or bool(os.environ.get("RAY_ADDRESS"))
    if ray.is_initialized():
        if config.ray.address is not None:
            return
        where, total = "the cluster", {k: float(v) for k, v in ray.cluster_resources().items()}
        free = {k: float(v) for k, v in ray.available_resources().items()}
        why = "it needs more {} than this local cluster has"
    elif not joined:
        where, total = "this machine", {"CPU": float(os.cpu_count() or 1), "GPU": float(_cuda_devices())}
        free = total
        why = "it needs more {} than this machine has (Ray was not started)"
    else:
        return
    asked = demands(config, free.get("CPU", 0.0) or total.get("CPU", 0.0), num_actors, num_learners)
    short = [k for k in ("CPU", "GPU") if _totals(asked)[k] > total.get(k, 0.0) + 1e-9]
    if short:
        raise placement_error(asked, total, free, why.format(" and ".join(short)), where=where)


def reserve(config: Any, num_actors: int | None = None, num_learners: int | None = None) -> Placement:
    """Start Ray if needed, then reserve one bundle per rollout worker and learner
    (`demands`); raise `PlacementError` if the cluster cannot hold them (at once when a
    local cluster is too small, see `check_fits`, else after `ray.placement_timeout_s`)."""
    check_fits(config, num_actors, num_learners)
    ray = ensure_ray(config)
    from ray.util.placement_group import placement_group, remove_placement_group

    total = {k: float(v) for k, v in ray.cluster_resources().items()}
    free_cpus = float(ray.available_resources().get("CPU", 0.0))
    asked = demands(config, free_cpus or total.get("CPU", 0.0), num_actors, num_learners)
    check_fits(config, num_actors, num_learners)  # the cluster just started: its real totals
    bundles = [d.bundle() for d in asked for _ in range(d.count)]
    group = placement_group(bundles, strategy="PACK", name=f"workbench-{os.getpid()}-{uuid.uuid4().hex[:12]}")
    timeout = config.ray.placement_timeout_s
    ready, _ = ray.wait([group.ready()], timeout=timeout)
    if not ready:
        available = ray.available_resources()
        remove_placement_group(group)
        raise placement_error(asked, total, available, f"nothing was reserved within ray.placement_timeout_s="
                              f"{timeout:g} s (other actors or placement groups may hold the rest)")
    return Placement(group, asked)


def _cause(exc: BaseException) -> str:
    """The line of a Ray error that says what went wrong (`ModuleNotFoundError: ...`),
    without Ray's own wrapper names."""
    lines = [ln.strip() for ln in str(exc).splitlines() if ln.strip()]
    if type(exc).__name__ == "OutOfMemoryError":  # Ray's memory monitor killed it
        return f"out of memory: {lines[0][:300] if lines else 'killed by Ray'}"
    for ln in reversed(lines):  # the innermost exception is printed last
        head, _, rest = ln.partition(": ")
        kind = head.rsplit(".", 1)[-1]
        if not rest or " " in head or not kind.endswith(("Error", "Exception", "Interrupt", "Exit")):
            continue
        if kind == "RaySystemError":
            return rest.removeprefix("System error: ")
        if not kind.startswith(("Ray", "Actor")):
            return f"{kind}: {rest}"
    for ln in lines:
        if "out of memory" in ln.lower() or "OOM" in ln:
            return ln
    return lines[-1] if lines else type(exc).__name__


def import_advice(cause: str) -> str:
    """What to do when a worker cannot import a module the driver can."""
    if "No module named" not in cause and "ModuleNotFoundError" not in cause:
        return ""
    return (" The workers cannot import a module the driver imports: install it as a package (pip install -e "
            "<folder>), put its folder on PYTHONPATH before starting Python (and Ray), or define the environment "
            "class in the notebook itself (classes from __main__ are shipped by value).")


def wait_started(actors: Iterable[tuple[str, Any]], timeout: float | None = None) -> None:
    """Wait until every (name, actor) has run its `__init__`; an actor that died while
    starting raises one `ActorStartError` naming it and the cause (the Ray traceback is
    kept as `__cause__`, not printed)."""
    ray = require_ray()
    pairs = list(actors)
    refs = {a.__ray_ready__.remote(): name for name, a in pairs}
    pending = list(refs)
    while pending:
        ready, pending = ray.wait(pending, num_returns=1, timeout=timeout)
        if not ready:
            raise ActorStartError(f"{', '.join(refs[r] for r in pending)} did not start within {timeout:g} s")
        try:
            ray.get(ready[0])
        except ray.exceptions.RayError as exc:  # died in __init__, killed (OOM), lost its node
            for _, a in pairs:
                ray.kill(a)
            raise start_error(refs[ready[0]], exc) from exc


def start_error(name: str, exc: BaseException, what: str = "died while starting") -> ActorStartError:
    """`ActorStartError` for actor `name`: the cause read out of Ray's error (`_cause`),
    with advice when it is a module the workers cannot import."""
    cause = _cause(exc)
    return ActorStartError(f"{name} {what}: {cause}.{import_advice(cause)}")


# -- environment code for the workers -------------------------------------------------------
def _reachable_roots() -> list[str]:
    """Folders a freshly started worker imports from: PYTHONPATH, the standard library and
    site-packages (an editable install's folder is found through its .pth file)."""
    roots = [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]
    roots += [sysconfig.get_paths()[k] for k in ("stdlib", "platstdlib", "purelib", "platlib")]
    return [os.path.realpath(p) for p in roots]


def _module_root(module: Any) -> str | None:
    """The sys.path folder a module was imported from (None for built-ins)."""
    file = getattr(module, "__file__", None)
    if not file:
        return None
    depth = module.__name__.count(".") + (1 if os.path.basename(file).startswith("__init__.") else 0)
    folder = os.path.dirname(os.path.realpath(file))
    for _ in range(depth):
        folder = os.path.dirname(folder)
    return folder


def _editable_roots() -> set[str]:
    """Folders that `.pth` files in site-packages add to the path (editable installs)."""
    roots = set()
    for site in {sysconfig.get_paths()["purelib"], sysconfig.get_paths()["platlib"]}:
        try:
            names = os.listdir(site)
        except OSError:
            continue
        for name in names:
            if name.endswith(".pth"):
                try:
                    with open(os.path.join(site, name)) as fh:
                        roots.update(os.path.realpath(ln.strip()) for ln in fh
                                     if ln.strip() and not ln.startswith(("import", "#")))
                except OSError:
                    pass
    return roots


def _editable_packages() -> set[str]:
    """Top-level packages that an editable install's import hook maps (setuptools'
    `__editable__..._finder` in `sys.meta_path`, whose `.pth` holds an import, not a folder):
    a worker started from the same Python finds them too."""
    names: set[str] = set()
    for finder in sys.meta_path:
        module = sys.modules.get(getattr(finder, "__module__", "") or "")
        mapping = getattr(module, "MAPPING", None) if module and "__editable__" in module.__name__ else None
        if isinstance(mapping, dict):
            names.update(mapping)
    return names


def _object_module(obj: Any) -> str | None:
    if isinstance(obj, type) or callable(obj) and not hasattr(obj, "step"):
        return getattr(obj, "__module__", None)  # a class or a factory function
    return type(obj).__module__  # an instance (a prototype environment, a tool, a parser)


def driver_only_modules(objects: Iterable[Any]) -> list[str]:
    """Top-level names of the modules defining `objects` (or their classes), and of the
    modules those import, that a worker could not import: found only through a folder
    the driver added to `sys.path` (classes from `__main__` are pickled by value anyway)."""
    reachable = set(_reachable_roots()) | _editable_roots()
    installed = _editable_packages()
    out: list[str] = []
    todo = [_object_module(obj) for obj in objects if obj is not None]
    seen: set[str] = set()
    while todo:
        name = todo.pop()
        if not name or name == "__main__" or name in seen:
            continue
        seen.add(name)
        top = name.split(".")[0]
        module = sys.modules.get(top)
        if module is None or top in ("workbench", "builtins") or top in installed:
            continue
        root = _module_root(module)
        if root is None or os.path.realpath(root) in reachable:
            continue
        if top not in out:
            out.append(top)
        for value in vars(sys.modules.get(name, module)).values():  # what that module imported
            if isinstance(value, type(sys)):
                todo.append(value.__name__)
            elif isinstance(value, type) or callable(value):
                todo.append(getattr(value, "__module__", None))
    return out


def ship_modules(objects: Iterable[Any]) -> list[str]:
    """Register the driver-only modules of `objects` (`driver_only_modules`) with Ray's
    cloudpickle for pickling by value, so classes and functions from them reach the
    workers with their code; returns the module names."""
    import ray.cloudpickle as cloudpickle

    names = driver_only_modules(objects)
    for name in names:
        cloudpickle.register_pickle_by_value(sys.modules[name])
    return names


__all__ = ["RAY_INSTALL_COMMAND", "require_ray", "start_error", "check_fits", "ActorStartError", "Demand", "Placement", "PlacementError", "demands", "driver_only_modules",
           "ensure_ray", "fair_cpu_share", "reserve", "ship_modules", "wait_started"]
