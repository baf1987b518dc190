"""What `workbench.config` checks values with: `ConfigError`, the device and dtype
resolvers ("auto" -> CUDA/bf16, CPU/bf16 where it has bf16 instructions, else fp32), and the type checks behind
`ConfigStore.validate` and `ConfigStore.update` (each field against its annotation,
floats finite, numeric strings read as numbers for float fields)."""
from __future__ import annotations

import dataclasses
import functools
import math
import sys
import types
import typing
from typing import TYPE_CHECKING, Any

from workbench.utils.settings import ConfigError, UnknownFieldError, unknown_field_message  # noqa: F401 - re-exported

if TYPE_CHECKING:
    import torch

DTYPES = ("float32", "bfloat16", "float16")

#: Upper bound of `environment.step_timeout` (a week): longer waits overflow the timers
#: (`threading.TIMEOUT_MAX`) and fail every reset; 0 or null means no limit.
MAX_STEP_TIMEOUT_S = 7 * 24 * 3600.0
#: Bound of every integer field (a C int): larger values overflow the C code they reach
#: (`collections.deque(maxlen=...)`, torch sizes) long after validation. Seeds (fields
#: named `seed`) may use the 32-bit unsigned range numpy's seeds use.
MAX_INT_FIELD = 2**31 - 1
MAX_SEED = 2**32 - 1
#: Bound of the reward weights and the overlong penalty (`reward.*`): scores are float32
#: (about 7 significant digits), so a larger weight drowns every other term of the reward,
#: and past ~3.4e38 it overflows.
MAX_REWARD_WEIGHT = 1e6
#: A config YAML larger than this is refused by `ConfigStore.load`.
MAX_YAML_BYTES = 4 * 2**20
#: Values (mappings, lists, scalars) a config YAML may expand to, aliases counted once per use.
MAX_YAML_NODES = 200_000




def _parse_device(device: Any, field: str) -> "torch.device":
    """`device` as a torch.device (no availability check); ConfigError naming `field` if unparsable."""
    import torch

    if isinstance(device, torch.device):
        return device
    if isinstance(device, str) and device.strip() == device and device:
        try:
            return torch.device(device)
        except (RuntimeError, ValueError, TypeError):
            pass
    raise ConfigError(f"{field} must be \"auto\" or a torch device such as \"cpu\", \"cuda\" or \"cuda:1\"; "
                      f"got {device!r}")


def resolve_device(device: "str | torch.device" = "auto", cuda_available: bool | None = None,
                   field: str = "model.device") -> "torch.device":
    """The torch.device that `device` names: "auto" is CUDA when available, else CPU.

    `cuda_available` defaults to `torch.cuda.is_available()`; pass it to decide for
    another machine. An explicit CUDA device where CUDA is not available, or a string
    torch does not parse, raises ConfigError naming `field`.
    """
    import torch

    if cuda_available is None:
        cuda_available = torch.cuda.is_available()
    if device == "auto":
        return torch.device("cuda" if cuda_available else "cpu")
    resolved = _parse_device(device, field)
    if resolved.type == "cuda" and not cuda_available:
        raise ConfigError(f"{field} is {str(device)!r} but CUDA is not available on this machine; "
                          "use \"auto\" or \"cpu\"")
    return resolved


@functools.lru_cache(maxsize=None)
def cpu_bf16_support() -> tuple[bool, str]:
    """(whether this CPU multiplies bfloat16 matrices natively, why), decided once.

    Yes when torch's oneDNN bf16 path is built and usable here
    (`torch.ops.mkldnn._is_mkldnn_bf16_supported()`) and the CPU reports bf16 dot-product
    or matrix instructions (`avx512_bf16` or `amx_bf16` in /proc/cpuinfo). oneDNN alone
    only needs AVX-512 and then emulates bf16, which is slower than fp32; ARM's bf16 and
    other systems without /proc/cpuinfo are not probed (fp32).
    """
    import torch

    try:
        onednn = bool(torch.ops.mkldnn._is_mkldnn_bf16_supported())
    except (AttributeError, RuntimeError):
        onednn = False
    if not onednn:
        return False, "torch's oneDNN has no bfloat16 path on this CPU"
    try:
        with open("/proc/cpuinfo") as f:
            flags = {w for line in f if line.startswith("flags") for w in line.split(":", 1)[1].split()}
    except OSError:
        return False, "no /proc/cpuinfo to read the CPU's bf16 flags from"
    found = sorted(flags & {"avx512_bf16", "amx_bf16"})
    if not found:
        return False, "the CPU reports no avx512_bf16/amx_bf16 instructions"
    return True, f"the CPU reports {' and '.join(found)}"


#: The environment variable that decides what `dtype="auto"` is on a CPU: "bfloat16" or "float32"
#: (unset or "": the CPU decides, `cpu_bf16_support`). It lets one machine check both dtypes:
#: `make test` runs its numerics-sensitive tests a second time with the dtype this CPU does not
#: pick (emulated bf16 on a CPU without bf16 instructions is slow, but exact to bf16).
AUTO_DTYPE_ENV = "WORKBENCH_AUTO_DTYPE"


def cpu_auto_bf16() -> tuple[bool, str]:
    """(whether "auto" is bfloat16 on this CPU, why): `WORKBENCH_AUTO_DTYPE` when set, else
    `cpu_bf16_support()`. ConfigError for a value other than bfloat16 / float32."""
    import os

    value = os.environ.get(AUTO_DTYPE_ENV, "").strip()
    if not value:
        return cpu_bf16_support()
    if value not in ("bfloat16", "float32"):
        raise ConfigError(f"{AUTO_DTYPE_ENV}={value!r}: give bfloat16 or float32 (what dtype \"auto\" is on a CPU), "
                          "or unset it to let the CPU decide")
    native, why = cpu_bf16_support()
    return value == "bfloat16", f"{AUTO_DTYPE_ENV}={value} (without it: {'bfloat16' if native else 'float32'}, {why})"


_announced: set[tuple[str, str]] = set()


def _announce(field: str, dtype: "torch.dtype", reason: str) -> None:
    """Say once per process what "auto" chose and why: on stderr, or in a Jupyter kernel on
    stdout (a notice, not an error: the notebook's stderr box is for those)."""
    from workbench.utils.progress import in_jupyter

    key = (field, str(dtype))
    if key not in _announced:
        _announced.add(key)
        print(f"workbench: {field} \"auto\" -> {str(dtype).removeprefix('torch.')}: {reason}",
              file=sys.stdout if in_jupyter() else sys.stderr)


def resolve_dtype(dtype: "str | torch.dtype" = "auto", device: "str | torch.device" = "cpu",
                  field: str = "model.dtype", trains_all_weights: bool = False) -> "torch.dtype":
    """The torch.dtype that `dtype` names. "auto" is bfloat16 on a CUDA device and on a CPU
    with native bf16 matrix instructions (`cpu_bf16_support`), float32 elsewhere; the
    environment variable `WORKBENCH_AUTO_DTYPE` (bfloat16 or float32) decides instead when set
    (`cpu_auto_bf16`). The choice and its reason are printed once per process.

    `trains_all_weights` (full fine-tuning): "auto" stays float32 on the CPU, because the
    optimizer would update bf16 weights in place with no fp32 master copy (see
    `workbench.training.policy.Policy`); on CUDA "auto" is bfloat16 as before.
    `device` is a resolved device (or its string); an unknown name raises ConfigError naming `field`.
    """
    import torch

    if isinstance(dtype, torch.dtype):
        return dtype
    if dtype == "auto":
        if torch.device(device).type == "cuda":
            return torch.bfloat16
        if torch.device(device).type != "cpu":
            return torch.float32
        ok, why = cpu_auto_bf16()
        if ok and trains_all_weights:
            chosen, why = torch.float32, f"{why}, but full fine-tuning keeps fp32 weights (no fp32 master copy of bf16 ones)"
        else:
            chosen = torch.bfloat16 if ok else torch.float32
        _announce(field, chosen, why)
        return chosen
    if dtype not in DTYPES:
        raise ConfigError(f"{field} must be one of {['auto', *DTYPES]}, got {dtype!r}")
    return getattr(torch, dtype)


def _choice(name: str, value: Any, valid: tuple[str, ...]) -> None:
    if value not in valid:
        raise ConfigError(f"{name} must be one of {sorted(valid)}, got {value!r}")


_TYPE_CACHE: dict[type, dict[str, Any]] = {}


def _field_types(cls: type) -> dict[str, Any]:
    """Field name -> evaluated type annotation of a config dataclass."""
    if cls not in _TYPE_CACHE:
        hints = typing.get_type_hints(cls)
        _TYPE_CACHE[cls] = {f.name: hints[f.name] for f in dataclasses.fields(cls)}
    return _TYPE_CACHE[cls]


def _arms(hint: Any) -> tuple[Any, ...]:
    """The alternatives of a union annotation (the annotation itself otherwise)."""
    if typing.get_origin(hint) in (typing.Union, types.UnionType):
        return typing.get_args(hint)
    return (hint,)


def _coerce_number(value: Any, hint: Any) -> Any:
    """For a float field: a numeric string or an int becomes a float; anything else is kept
    as it is (validation then names the field if it is wrong)."""
    arms = _arms(hint)
    if float not in arms or int in arms or isinstance(value, bool):
        return value
    if isinstance(value, str):
        try:
            return float(value)
        except ValueError:
            return value
    if isinstance(value, int):
        try:
            return float(value)
        except OverflowError:
            return value
    return value


def _conforms(value: Any, hint: Any) -> bool:
    if hint is Any:
        return True
    origin = typing.get_origin(hint)
    if origin in (typing.Union, types.UnionType):
        return any(_conforms(value, arm) for arm in typing.get_args(hint))
    if origin is typing.Literal:
        return any(value == v and type(value) is type(v) for v in typing.get_args(hint))
    if hint is type(None):
        return value is None
    if hint is bool:
        return isinstance(value, bool)
    if hint is int:
        return isinstance(value, int) and not isinstance(value, bool)
    if hint is float:
        return isinstance(value, (int, float)) and not isinstance(value, bool)
    if origin is list:
        (item,) = typing.get_args(hint) or (Any,)
        return isinstance(value, list) and all(_conforms(v, item) for v in value)
    if origin is dict:
        key, item = typing.get_args(hint) or (Any, Any)
        return isinstance(value, dict) and all(_conforms(k, key) and _conforms(v, item) for k, v in value.items())
    return isinstance(value, hint) if isinstance(hint, type) else True


def _describe(hint: Any) -> str:
    origin = typing.get_origin(hint)
    if origin in (typing.Union, types.UnionType):
        return " or ".join(_describe(arm) for arm in typing.get_args(hint))
    if origin is typing.Literal:
        return " or ".join(repr(v) for v in typing.get_args(hint))
    names = {type(None): "null", bool: "true or false", int: "an integer", float: "a number", str: "a string"}
    if hint in names:
        return names[hint]
    if origin is list:
        return f"a list of {_describe(typing.get_args(hint)[0]).removeprefix('a ').removeprefix('an ')}s"
    if origin is dict:
        return "a mapping with string keys"
    return getattr(hint, "__name__", str(hint))


def _short(value: Any, limit: int = 60) -> str:
    text = repr(value)
    return text if len(text) <= limit else text[:limit] + "..."


def _check_types(section: str, obj: Any) -> None:
    """Every field of one section has its annotated type, and every float is finite."""
    for name, hint in _field_types(type(obj)).items():
        value = getattr(obj, name)
        if not _conforms(value, hint):
            raise ConfigError(f"{section}.{name} must be {_describe(hint)}, got {_short(value)} "
                              f"({type(value).__name__})")
        if float in _arms(hint) and isinstance(value, (int, float)) and not isinstance(value, bool):
            try:
                finite = math.isfinite(value)
            except OverflowError:  # an int too large for a float
                finite = False
            if not finite:
                raise ConfigError(f"{section}.{name} must be a finite number, got {_short(value)}")
        if int in _arms(hint) and isinstance(value, int) and not isinstance(value, bool):
            bound = MAX_SEED if name == "seed" else MAX_INT_FIELD
            if not -bound <= value <= bound:
                raise ConfigError(f"{section}.{name} must be an integer between {-bound:,} and {bound:,}, "
                                  f"got {_short(value)}")


def _positive_int(name: str, value: Any) -> None:
    if not isinstance(value, int) or isinstance(value, bool) or value < 1:
        raise ConfigError(f"{name} must be an integer >= 1, got {value!r}")


def safe_load_bounded(text: str, where: str = "the YAML") -> Any:
    """`yaml.safe_load(text)`, refusing an anchor bomb before anything is built.

    PyYAML builds an alias as a reference to the anchored object, so a few lines of
    nested aliases load in microseconds and explode only later (a deep copy, a dump, a
    loop over `environment.params`). The composed node graph is measured first: each
    node counts once per place it appears (aliases expanded, memoised per node, so the
    count is cheap); past `MAX_YAML_NODES`, or a text over `MAX_YAML_BYTES`, is a
    ConfigError naming `where`."""
    import yaml

    if len(text) > MAX_YAML_BYTES:
        raise ConfigError(f"{where} is {len(text):,} characters, over the {MAX_YAML_BYTES:,} a config may hold")
    # One parse (libyaml's when PyYAML was built with it: the same safe tags, several times faster):
    # the node graph is measured, then built into Python objects.
    loader = getattr(yaml, "CSafeLoader", yaml.SafeLoader)(text)
    try:
        node = loader.get_single_node()
        if node is None:
            return None
        return _construct_bounded(yaml, loader, node, where)
    finally:
        loader.dispose()


def _construct_bounded(yaml: Any, loader: Any, node: Any, where: str) -> Any:
    """The document `node` built by `loader`, after its size with aliases expanded is
    checked against `MAX_YAML_NODES`."""
    sizes: dict[int, int] = {}

    def size(n: Any) -> int:
        if id(n) in sizes:
            return sizes[id(n)]
        sizes[id(n)] = 1  # a recursive alias counts once instead of looping
        total = 1
        if isinstance(n, yaml.MappingNode):
            total += sum(size(k) + size(v) for k, v in n.value)
        elif isinstance(n, yaml.SequenceNode):
            total += sum(size(v) for v in n.value)
        sizes[id(n)] = total
        return total

    count = size(node)
    if count > MAX_YAML_NODES:
        raise ConfigError(f"{where} expands to {count:,} values through its anchors and aliases (&name / *name), "
                          f"over the {MAX_YAML_NODES:,} a config may hold: write the values out or remove the "
                          "aliases")
    return loader.construct_document(node)


def check_remedies(config: Any) -> None:
    """The remedy settings that depend on other sections: `training.dynamic_sampling`
    (needs a group-relative estimator and groups of two or more) and its bound, and the
    overlong penalty (`reward.overlong_penalty` >= 0 over a window of 1 to
    `inference.max_tokens` - 1 tokens). ConfigError naming the field otherwise."""
    from workbench.algo.advantages import GROUP_RELATIVE_ESTIMATORS

    t, r, i = config.training, config.reward, config.inference
    if t.dynamic_sampling_max_batches < 0:
        raise ConfigError(f"training.dynamic_sampling_max_batches must be an integer >= 0 (extra rollout rounds "
                          f"per step; 0 = drop flat groups without resampling), got {t.dynamic_sampling_max_batches!r}")
    if t.dynamic_sampling and t.adv_estimator not in GROUP_RELATIVE_ESTIMATORS:
        raise ConfigError(f"training.dynamic_sampling drops groups whose rewards are all equal, which matters only "
                          f"to a group-relative training.adv_estimator ({', '.join(GROUP_RELATIVE_ESTIMATORS)}); "
                          f"it is {t.adv_estimator!r}: set training.dynamic_sampling=false or change the estimator")
    if t.dynamic_sampling and t.group_size < 2:
        raise ConfigError(f"training.dynamic_sampling needs groups to compare: training.group_size must be >= 2, "
                          f"got {t.group_size}")
    if not isinstance(t.max_staleness, int) or isinstance(t.max_staleness, bool) or t.max_staleness < 0:
        raise ConfigError(f"training.max_staleness must be an integer >= 0: 0 = synchronous, k >= 1 = the batches of "
                          f"the next k steps sampled while this one trains, an episode trained at most k updates "
                          f"after the weights that sampled it; got {t.max_staleness!r}")
    _positive_int("training.async_rollout_threads", t.async_rollout_threads)
    if t.rollout_is not in ("auto", "token", "sequence", None):
        raise ConfigError(f"training.rollout_is must be 'auto', 'token', 'sequence' or null, got {t.rollout_is!r}")
    if not t.rollout_is_threshold >= 1:
        raise ConfigError(f"training.rollout_is_threshold must be >= 1 (the cap of the truncated importance "
                          f"weights), got {t.rollout_is_threshold!r}")
    if not 0 <= r.overlong_penalty <= MAX_REWARD_WEIGHT:
        raise ConfigError(f"reward.overlong_penalty must be between 0 and {MAX_REWARD_WEIGHT:g} (the most a reply "
                          f"that hits inference.max_tokens loses; 0 = off; scores are float32, so a larger penalty "
                          f"drowns every other term of the reward), got {r.overlong_penalty!r}")
    _positive_int("reward.overlong_buffer", r.overlong_buffer)
    if r.overlong_penalty > 0 and r.overlong_buffer >= i.max_tokens:
        raise ConfigError(f"reward.overlong_buffer ({r.overlong_buffer}) must be < inference.max_tokens "
                          f"({i.max_tokens}): the penalty ramps over the last overlong_buffer tokens before the "
                          "limit, and a window as long as the limit would penalise every reply by its length")
