"""The parts a caller may plug into the engine, each behind a Protocol, and how the engine builds them.

vLLM opens a few such seams (a scheduler class by dotted path, attention backends, plugins); nanoengine opens
one for every mechanism of its KV memory, so that another implementation can be run in the real engine:

| part | Protocol | built as |
|---|---|---|
| `block_table_cls` | `worker.block_table.BlockTableInterface` | `cls(block_size)`, one per KV cache group |
| `attention_backend` | `attention.AttentionBackend` | "torch", "triton", or a ready object |
| `hash_block_tokens` | `core.BlockTokensHasher` | a function `(parent_hash, token_ids, extra_keys)` |
| `free_queue_cls` | `core.FreeBlockQueue` | `cls(blocks)`, by the pool |
| `block_pool` | `core.BlockPoolInterface` | `factory(num_blocks, enable_caching)`, plus `free_queue_cls=` when given |
| `full_attention_manager_cls` | a subclass of `core.FullAttentionManager` | by the coordinator |
| `sliding_window_manager_cls` | a subclass of `core.SlidingWindowManager` | by the coordinator |
| `kv_cache_manager_cls` | `core.KVCacheManagerInterface` | `cls(block_size, block_pool, kv_cache_groups=..., ...)` |
| `scheduler_cls` | `core.sched.interface.SchedulerInterface` | `cls.from_config(engine_config, kv_cache_config)` |
| `proposer_cls` | `spec_decode.ngram_proposer.NgramProposer`'s `propose` | `cls(speculative_config, max_model_len)` |
| `rejection_sampler` | `sample.rejection_sampler.rejection_sample` | a function |

A part that fails to build, or lacks a member of its Protocol, raises InvalidEngineArgumentError naming the
argument; an exception a part raises while serving is attributed to it (`attribute`).
"""

from __future__ import annotations

import dataclasses
import inspect
import reprlib
import traceback
import types
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from nanoengine.errors import InvalidEngineArgumentError

_PACKAGE_DIR = str(Path(__file__).resolve().parent)


@dataclass(slots=True, frozen=True, kw_only=True)
class EngineParts:
    """The engine's parts, each the engine's own unless another was given (see the module's table).

    EngineArgs fills every field, so a field holds the part in use; `given` names the ones that are not the
    engine's own.
    """

    attention_backend: Any
    hash_block_tokens: Callable | None
    block_pool: Callable | None
    free_queue_cls: type | None
    full_attention_manager_cls: type
    sliding_window_manager_cls: type
    kv_cache_manager_cls: type
    scheduler_cls: type
    block_table_cls: type
    proposer_cls: type
    rejection_sampler: Callable
    given: frozenset[str] = frozenset()

    def named(self, name: str) -> str | None:
        """The part's argument name when it was given (for error messages), None for the engine's own."""
        return name if name in self.given else None


def build_part(name: str | None, factory, protocol, call: str, *args, **kwargs):
    """The part `factory(*args, **kwargs)` builds. For a given part (`name`, the argument it came through; None:
    the engine's own), a failure to build or a missing member of `protocol` (when one is given) raises
    InvalidEngineArgumentError naming the argument."""
    if name is None:
        return factory(*args, **kwargs)
    try:
        part = factory(*args, **kwargs)
    except InvalidEngineArgumentError:  # a part built inside this one named its own argument
        raise
    except Exception as exc:
        raise InvalidEngineArgumentError(
            f"{name}={reprlib.repr(factory)} failed when called as {name}{call}: {type(exc).__name__}: {exc}",
            parameter=name,
            value=factory,
        ) from exc
    missing = missing_members(part, protocol) if protocol else []
    if missing:
        raise InvalidEngineArgumentError(
            f"{name} gave a {type(part).__name__}, which lacks {', '.join(missing)} ({protocol.__name__}). Implement "
            "them, or subclass the engine's own part and override only what you change.",
            parameter=name,
            value=factory,
        )
    return part


def protocol_members(protocol) -> set[str]:
    """Every public member a Protocol declares: methods, properties and annotated attributes."""
    return {m for m in vars(protocol) if not m.startswith("_")} | set(protocol.__annotations__)


def missing_members(part, protocol) -> list[str]:
    return sorted(m for m in protocol_members(protocol) if not hasattr(part, m))


def check_pool_names_groups(pool) -> None:
    """A model of several KV cache groups names each block by hash and group: a pool given through block_pool
    must take kv_cache_group_id where the Protocol has it, or one group would be served another's blocks."""
    for method in ("get_cached_block", "cache_full_blocks"):
        params = inspect.signature(getattr(pool, method)).parameters
        if "kv_cache_group_id" not in params and not any(p.kind is p.VAR_KEYWORD for p in params.values()):
            raise InvalidEngineArgumentError(
                f"block_pool gave a {type(pool).__name__} whose {method} takes no kv_cache_group_id, and this model "
                "has sliding-window layers, so several KV cache groups share the pool. Name each block by "
                "make_block_hash_with_group_id(block_hash, kv_cache_group_id) (BlockPoolInterface), or leave "
                "block_pool out for this model.",
                parameter="block_pool",
                value=pool,
            )


def given_parts(parts: EngineParts, built: dict[str, Any]) -> dict[Any, str]:
    """The given parts, by what identifies their code in a traceback: a class, or a function's code object.
    built: parts whose class is known only once built (a pool factory's product), by argument name."""
    found: dict[Any, str] = {}
    for field in dataclasses.fields(parts):
        name = field.name
        if name not in parts.given:
            continue
        part = built.get(name, getattr(parts, name))
        if isinstance(part, types.FunctionType):
            found[part.__code__] = name
        else:
            found[part if isinstance(part, type) else type(part)] = name
    return found


def attribute(exc: BaseException, parts: dict[Any, str]) -> tuple[str, str] | None:
    """(argument, Class.method) of the innermost frame of a given part's code that `exc` passed through,
    preferring the part's own code over engine code it inherits; None if it passed through none."""
    found = []
    for frame, _ in traceback.walk_tb(exc.__traceback__):
        owner = frame.f_locals.get("self")
        by_class = parts.get(type(owner))
        name = by_class or parts.get(frame.f_code)
        if name:
            label = f"{type(owner).__name__}.{frame.f_code.co_name}" if by_class else frame.f_code.co_name
            own_code = not str(Path(frame.f_code.co_filename).resolve()).startswith(_PACKAGE_DIR)
            found.append((own_code, name, label))
    own = [f for f in found if f[0]] or found
    return own[-1][1:] if own else None
